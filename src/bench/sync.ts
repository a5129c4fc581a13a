import { execFile } from "node:child_process";
import { closeSync, constants, mkdirSync, openSync } from "node:fs";
import { lstat, mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import type { Pyro } from "../sdk/pyro.js";
import { GOALS } from "./backend-rows.js";
import { type BenchRow, medianMs, round, row } from "./stats.js";

const pexec = promisify(execFile);

/** A tree of `dirs` directories of `files` files of `size` bytes. */
export interface TreeShape {
  dirs: number;
  files: number;
  size: number;
}
/** The tree of the reset, push and export rows: 100 directories of 100 files of 10 KiB. */
export const BIG_SHAPE: TreeShape = { dirs: 100, files: 100, size: 10 * 1024 };
export const BIG_TREE = treeTotals(BIG_SHAPE);

export function treeTotals(shape: TreeShape): { files: number; bytes: number } {
  const files = shape.dirs * shape.files;
  return { files, bytes: files * shape.size };
}

/** Builds a tree of `shape` (default BIG_SHAPE) at `dir`. */
export async function makeTree(dir: string, shape: TreeShape = BIG_SHAPE): Promise<void> {
  for (let d = 0; d < shape.dirs; d++) {
    await mkdir(join(dir, `d${d}`), { recursive: true });
    const buf = Buffer.alloc(shape.size, d);
    await Promise.all(
      Array.from({ length: shape.files }, (_, f) => writeFile(join(dir, `d${d}`, `f${f}.bin`), buf)),
    );
  }
}

/** Regular files under `dir` and their bytes (directories and links not counted). */
export async function treeStats(dir: string): Promise<{ files: number; bytes: number }> {
  let files = 0;
  let bytes = 0;
  for (const e of await readdir(dir, { withFileTypes: true, recursive: true })) {
    if (!e.isFile()) continue;
    files++;
    bytes += (await lstat(join(e.parentPath, e.name))).size;
  }
  return { files, bytes };
}

/**
 * Throws unless `dir` holds exactly the files and bytes of `shape` (default BIG_SHAPE):
 * a row must not time an empty copy (the export row once read ~15 ms because the seed
 * sat in pyro's home, which seeding excludes, so the workspace it exported was empty).
 */
export async function expectTree(dir: string, what: string, shape: TreeShape = BIG_SHAPE): Promise<void> {
  const want = treeTotals(shape);
  const got = await treeStats(dir);
  if (got.files !== want.files || got.bytes !== want.bytes)
    throw new Error(
      `bench: ${what} holds ${got.files} files / ${got.bytes} bytes, not ${want.files} / ${want.bytes}`,
    );
}

/**
 * Microseconds of one file creation under `dir` (the mean over `n` empty files in
 * directories of 100, made with direct system calls and left for the caller's clean-up).
 * The push and export rows print it because their floor is mostly this on this machine:
 * its ext4 has no journal, and such an ext4 allocates an inode only after skipping every
 * free one deleted in the last 1-6 minutes in the directory's group, reading each one's
 * deletion time (fs/ext4/ialloc.c, recently_deleted). Where other sessions or earlier
 * samples have just deleted tens of thousands of files, a creation costs 0.3-1 ms of
 * kernel CPU instead of ~20 µs, and `tar | tar` of the 10k-file tree takes 4-11 s
 * instead of 0.8 s (docs/architecture.md, "Benchmarks").
 */
export function createCostUs(dir: string, n = 1000): number {
  const flags = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL;
  const t = performance.now();
  for (let i = 0; i < n; i++) {
    const sub = join(dir, `c${Math.floor(i / 100)}`);
    if (i % 100 === 0) mkdirSync(sub, { recursive: true });
    closeSync(openSync(join(sub, `f${i % 100}`), flags, 0o600));
  }
  return ((performance.now() - t) * 1000) / n;
}

/** The rows' note on the creation cost (createCostUs) where their samples wrote, before and after them. */
export function creationNote(beforeUs: number, afterUs: number): string {
  return `a file creation here ${Math.round(beforeUs)} µs before, ${Math.round(afterUs)} µs after (both sides allocator-bound above ~100 µs)`;
}

/** Times `fn` alone `runs` times; `after` (a check), if any, runs untimed after each. */
async function timedRuns(
  runs: number,
  fn: (i: number) => Promise<void>,
  after?: (i: number) => Promise<void>,
): Promise<number[]> {
  const times: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t = performance.now();
    await fn(i);
    times.push(performance.now() - t);
    await after?.(i);
  }
  return times;
}

/**
 * Reset of a 10k-file / 100 MB workspace against `cp -a` of the same tree, and sync push
 * and export of it against a `tar | tar` pipe, each into a fresh directory. The tree sits
 * outside pyro's home (a seed inside it is excluded), and every copy is checked to hold
 * the whole tree, untimed.
 */
export async function syncRows(o: {
  pyro: Pyro;
  quick: boolean;
  log: (s: string) => void;
}): Promise<BenchRow[]> {
  const { pyro, quick, log } = o;
  const scratch = await mkdtemp(join(tmpdir(), "pyro-bench-sync-"));
  try {
    log("bench: building a 10k-file / 100 MB seed");
    const seed = join(scratch, "seed");
    await makeTree(seed);
    await expectTree(seed, "the seed");
    const out = (name: string, i: number) => join(scratch, `${name}-${i}`);
    // Nothing a sample writes is removed before the rows are done (the scratch directory
    // goes at the end): a deletion of 10k files makes the next creations in its group
    // cost up to 1 ms each on this machine (createCostUs), and once made whichever side
    // ran after a deletion the slower one.
    const cpMs = await timedRuns(
      3,
      (i) => pexec("cp", ["-a", seed, out("cp", i)]).then(() => undefined),
      (i) => expectTree(out("cp", i), "the cp -a copy"),
    );
    const big = await pyro.createWorkspace({ backend: "bwrap", seedPath: seed });
    const seeded = big.workspace_seed;
    if (seeded.file_count !== BIG_TREE.files || seeded.bytes !== BIG_TREE.bytes)
      throw new Error(
        `bench: the workspace was seeded with ${seeded.file_count} files / ${seeded.bytes} bytes`,
      );
    try {
      const rows = [await resetRow(pyro, big.workspace_id, quick, cpMs)];
      // The creation cost where the copies land, before and after their samples.
      const before = createCostUs(join(scratch, "probe-before"));
      // Pushes go to a workspace of their own, each to a new place: nothing is removed
      // between samples, and the exported workspace holds only the seed.
      const sink = await pyro.createWorkspace({ backend: "bwrap" });
      let copies: BenchRow[];
      try {
        copies = await throughputRows(
          pyro,
          { exported: big.workspace_id, pushed: sink.workspace_id },
          seed,
          out,
        );
      } finally {
        await pyro.deleteWorkspace(sink.workspace_id);
      }
      const after = createCostUs(join(scratch, "probe-after"));
      const note = creationNote(before, after);
      return [...rows, ...copies.map((r) => ({ ...r, note: `${r.note}; ${note}` }))];
    } finally {
      await pyro.deleteWorkspace(big.workspace_id);
    }
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}

async function resetRow(pyro: Pyro, id: string, quick: boolean, cpMs: number[]): Promise<BenchRow> {
  const change = async (cmd: string) => {
    const r = await pyro.execWorkspace(id, cmd);
    if (r.exit_code !== 0) throw new Error(`bench: '${cmd}' exited ${r.exit_code}: ${r.stderr}`);
  };
  const resetMs = await medianMs(
    quick ? 2 : 5,
    async () => {
      await change("rm -rf d1 && echo x > d2/f1.bin && touch new.txt");
      await pyro.resetWorkspace(id);
    },
    0,
  );
  // medianMs timed the exec too; time resets alone for the row, each checked to restore.
  const resetOnly: number[] = [];
  for (let i = 0; i < (quick ? 2 : 5); i++) {
    await change("rm -rf d1 && echo x > d2/f1.bin && touch new.txt");
    const t = performance.now();
    await pyro.resetWorkspace(id);
    resetOnly.push(performance.now() - t);
    await change("test -f d1/f99.bin && test ! -e new.txt");
  }
  return row(
    "reset 10k files / 100 MB",
    resetOnly,
    "cp -a of the tree",
    cpMs,
    GOALS.reset10k,
    `exec+reset ${round(resetMs)} ms`,
  );
}

/** One timed step: `fn` alone is timed; `after` (a check), if any, runs untimed. */
interface Step {
  fn: (i: number) => Promise<void>;
  after?: (i: number) => Promise<void>;
}

/** Each step once per round, `runs` rounds: load changes hit the floor and the rows alike. */
async function alternately(runs: number, steps: Record<string, Step>): Promise<Record<string, number[]>> {
  const times: Record<string, number[]> = Object.fromEntries(Object.keys(steps).map((k) => [k, []]));
  for (let i = 0; i < runs; i++)
    for (const [name, step] of Object.entries(steps))
      times[name]!.push(
        ...(await timedRuns(
          1,
          () => step.fn(i),
          () => step.after?.(i) ?? Promise.resolve(),
        )),
      );
  return times;
}

async function throughputRows(
  pyro: Pyro,
  ids: { exported: string; pushed: string },
  seed: string,
  out: (name: string, i: number) => string,
): Promise<BenchRow[]> {
  const t = await alternately(3, {
    tar: {
      fn: async (i) => {
        await mkdir(out("tar", i));
        await pexec("sh", ["-c", 'tar -C "$1" -cf - . | tar -C "$2" -xf -', "sh", seed, out("tar", i)]);
      },
      after: (i) => expectTree(out("tar", i), "the tar | tar copy"),
    },
    push: {
      fn: async (i) => {
        const r = await pyro.syncPushWorkspace(ids.pushed, seed, { dest: `/workspace/pushed${i}` });
        if (r.files < BIG_TREE.files) throw new Error(`bench: sync push wrote ${r.files} files`);
      },
    },
    // The exported workspace holds the seed alone: the export is of BIG_TREE.
    export: {
      fn: async (i) => {
        await pyro.exportWorkspace(ids.exported, "/workspace", out("export", i));
      },
      after: (i) => expectTree(out("export", i), "the export"),
    },
  });
  return [
    row(
      "sync push 100 MB",
      t.push!,
      "tar | tar pipe",
      t.tar!,
      GOALS.sync,
      `samples alternate with the floor's; ${viaNote(pyro, ids.pushed, "sync_push")}`,
    ),
    row(
      "export 100 MB",
      t.export!,
      "tar | tar pipe",
      t.tar!,
      GOALS.sync,
      `samples alternate with the floor's; ${viaNote(pyro, ids.exported, "export")}`,
    ),
  ];
}

/** Which path the samples took (the events' `via`: GNU tar on both sides, or the agent). */
function viaNote(pyro: Pyro, id: string, kind: string): string {
  const vias = pyro.engine
    .store()
    .listEvents(id)
    .filter((e) => e.kind === kind)
    .map((e) => (e.detail as { via?: string }).via ?? "agent");
  const tar = vias.filter((v) => v === "tar").length;
  return `${tar} of ${vias.length} through GNU tar on both sides, the rest through the agent`;
}
