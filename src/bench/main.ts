import { execFile } from "node:child_process";
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { Pyro } from "../sdk/pyro.js";
import { run } from "../util/run.js";
import { type BenchRow, medianMs, printTable, round, row } from "./stats.js";

const pexec = promisify(execFile);

/**
 * `npm run bench`: every capability against a raw floor measured in the same run, as a
 * ratio (machines differ; ratios measured together travel). Prints a table, and the rows
 * as JSON with --json.
 */
async function main(): Promise<void> {
  const json = process.argv.includes("--json");
  const quick = process.argv.includes("--quick");
  const log = (s: string) => process.stderr.write(`${s}\n`);
  const home = await mkdtemp(join(tmpdir(), "pyro-bench-"));
  const pyro = new Pyro({ home });
  const rows: BenchRow[] = [];
  const extra: Record<string, unknown> = {};
  const n = quick ? 5 : 20;
  try {
    log("bench: pulling debian:12");
    const env = await pyro.pullEnvironment("debian:12");

    // Floor: a bare bwrap spawn of /bin/true over the same rootfs.
    const bwrapTrue = [
      "bwrap",
      "--unshare-all",
      "--die-with-parent",
      "--ro-bind",
      env.rootfs,
      "/",
      "--proc",
      "/proc",
      "--dev",
      "/dev",
      "/bin/true",
    ];
    const floor = await medianMs(n, async () => {
      const r = await run(bwrapTrue, { killGroup: false });
      if (r.exitCode !== 0) throw new Error(`bwrap floor failed: ${r.stderr}`);
    });
    log(`bench: floor bwrap /bin/true ${round(floor)} ms`);

    const createMs = await medianMs(
      quick ? 2 : 5,
      async () => {
        const w = await pyro.createWorkspace({ backend: "bwrap" });
        await pyro.deleteWorkspace(w.workspace_id);
      },
      0,
    );
    rows.push(row("workspace create (warm env)", createMs, "bwrap /bin/true", floor, {}));

    const ws = await pyro.createWorkspace({ backend: "bwrap" });
    const execMs = await medianMs(
      n * 2,
      async () => {
        const r = await pyro.execWorkspace(ws.workspace_id, "true");
        if (r.exit_code !== 0) throw new Error("exec failed");
      },
      3,
    );
    rows.push(row("workspace exec true (warm)", execMs, "bwrap /bin/true", floor, { max: 0.5 }));
    extra.agent_rss_kib = await sandboxRssKib(ws.workspace_id);
    await pyro.deleteWorkspace(ws.workspace_id);

    const runMs = await medianMs(quick ? 3 : 10, async () => {
      const r = await pyro.run("debian:12", "true", { backend: "bwrap" });
      if (r.exit_code !== 0) throw new Error("run failed");
    });
    rows.push(row("run debian:12 -- true", runMs, "bwrap /bin/true", floor, { max: 3 }));

    // Reset of a 10k-file / 100 MB workspace against `cp -a` of the same tree.
    log("bench: building a 10k-file / 100 MB seed");
    const seed = join(home, "seed");
    for (let d = 0; d < 100; d++) {
      await mkdir(join(seed, `d${d}`), { recursive: true });
      const buf = Buffer.alloc(10 * 1024, d);
      await Promise.all(
        Array.from({ length: 100 }, (_, f) => writeFile(join(seed, `d${d}`, `f${f}.bin`), buf)),
      );
    }
    const cpMs = await medianMs(
      3,
      async () => {
        await pexec("cp", ["-a", seed, join(home, "cp-copy")]);
        await rm(join(home, "cp-copy"), { recursive: true, force: true });
      },
      0,
    );
    const big = await pyro.createWorkspace({ backend: "bwrap", seedPath: seed });
    const resetMs = await medianMs(
      quick ? 2 : 5,
      async () => {
        await pyro.execWorkspace(big.workspace_id, "rm -rf d1 && echo x > d2/f1.bin && touch new.txt");
        const t = performance.now();
        await pyro.resetWorkspace(big.workspace_id);
        return performance.now() - t;
      },
      0,
    );
    // medianMs timed the exec too; time resets alone for the row.
    const resetOnly: number[] = [];
    for (let i = 0; i < (quick ? 2 : 5); i++) {
      await pyro.execWorkspace(big.workspace_id, "rm -rf d1 && echo x > d2/f1.bin");
      const t = performance.now();
      await pyro.resetWorkspace(big.workspace_id);
      resetOnly.push(performance.now() - t);
    }
    resetOnly.sort((a, b) => a - b);
    rows.push(
      row(
        "reset 10k files / 100 MB",
        resetOnly[Math.floor(resetOnly.length / 2)]!,
        "cp -a of the tree",
        cpMs,
        { max: 0.2 },
        `exec+reset ${round(resetMs)} ms`,
      ),
    );

    // Throughput: sync push and export against a tar | tar pipe of the same tree.
    const tarPipe = await medianMs(
      3,
      async () => {
        const out = join(home, "tar-out");
        await mkdir(out, { recursive: true });
        await pexec("sh", ["-c", 'tar -C "$1" -cf - . | tar -C "$2" -xf -', "sh", seed, out]);
        await rm(out, { recursive: true, force: true });
      },
      0,
    );
    const pushMs = await medianMs(
      3,
      async () => {
        await pyro.syncPushWorkspace(big.workspace_id, seed, { dest: "/workspace/pushed" });
        await pyro.execWorkspace(big.workspace_id, "rm -rf pushed");
      },
      0,
    );
    rows.push(
      row(
        "sync push 100 MB",
        pushMs,
        "tar | tar pipe",
        tarPipe,
        { min: 0.5, inverse: true },
        "includes an rm of the pushed tree",
      ),
    );
    const exportMs = await medianMs(
      3,
      async () => {
        const out = join(home, "export-out");
        await pyro.exportWorkspace(big.workspace_id, "/workspace", out);
        await rm(out, { recursive: true, force: true });
      },
      0,
    );
    rows.push(row("export 100 MB", exportMs, "tar | tar pipe", tarPipe, { min: 0.5, inverse: true }));
    await pyro.deleteWorkspace(big.workspace_id);
  } finally {
    await pyro.close();
    await rm(home, { recursive: true, force: true });
  }
  if (json) process.stdout.write(`${JSON.stringify({ rows, ...extra }, null, 2)}\n`);
  else {
    process.stdout.write(`${printTable(rows)}\n`);
    if (extra.agent_rss_kib)
      process.stdout.write(
        `\nidle workspace memory (sandbox processes' RSS): ${round(Number(extra.agent_rss_kib) / 1024, 1)} MiB\n`,
      );
  }
}

/** Sum of VmRSS of the processes in a workspace's cgroup (v1 pids controller or v2). */
async function sandboxRssKib(id: string): Promise<number | null> {
  for (const dir of [`/sys/fs/cgroup/pids/pyro/${id}`, `/sys/fs/cgroup/pyro/${id}`]) {
    try {
      const pids = (await readFile(join(dir, "cgroup.procs"), "utf8")).split("\n").filter(Boolean);
      let total = 0;
      for (const pid of pids) {
        const status = await readFile(`/proc/${pid}/status`, "utf8").catch(() => "");
        total += Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0);
      }
      return total;
    } catch {
      // try the next layout
    }
  }
  void readdir;
  return null;
}

main().catch((err) => {
  process.stderr.write(`bench failed: ${(err as Error).stack ?? err}\n`);
  process.exitCode = 1;
});
