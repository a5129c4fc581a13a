import { execFileSync } from "node:child_process";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Pyro } from "../sdk/pyro.js";
import { run } from "../util/run.js";
import { type BenchRow, median, row } from "./stats.js";

const GIT_ENV = {
  ...process.env,
  GIT_AUTHOR_NAME: "bench",
  GIT_AUTHOR_EMAIL: "bench@localhost",
  GIT_COMMITTER_NAME: "bench",
  GIT_COMMITTER_EMAIL: "bench@localhost",
};

/** The change both sides commit: `n` files modified and `n` added, in nested directories. */
function changeScript(n: number): string {
  return `for i in $(seq 1 ${n}); do echo "changed $i" >> src/d$((i % 10))/f$i.txt; mkdir -p new/d$((i % 10)); echo "new $i" > new/d$((i % 10))/n$i.txt; done`;
}

/**
 * "workspace commit of N changed files" (bwrap) against the raw floor `git add -A && git
 * commit` of the same change in a scratch clone on the host. The commit carries the
 * agent round trips (diff, tar of the changed paths) and the plumbing on the host.
 */
export async function commitRows(o: { quick: boolean; log: (s: string) => void }): Promise<BenchRow[]> {
  const dir = await mkdtemp(join(tmpdir(), "pyro-bench-commit-"));
  const pyro = new Pyro({ home: join(dir, "home") });
  try {
    try {
      await pyro.engine.chooseBackend("bwrap", false);
    } catch (err) {
      o.log(`bench: commit row skipped: ${(err as Error).message}`);
      return [];
    }
    const n = 100;
    const repo = join(dir, "repo");
    const git = (cwd: string, ...a: string[]) =>
      execFileSync("git", ["-C", cwd, ...a], { env: GIT_ENV, encoding: "utf8" });
    execFileSync("git", ["init", "-q", "-b", "main", repo]);
    for (let i = 1; i <= 400; i++) {
      await mkdir(join(repo, "src", `d${i % 10}`), { recursive: true });
      await writeFile(join(repo, "src", `d${i % 10}`, `f${i}.txt`), `file ${i}\n`.repeat(20));
    }
    git(repo, "add", "-A");
    git(repo, "commit", "-qm", "seed");
    const seed = git(repo, "rev-parse", "HEAD").trim();

    // Floor: the same change committed with porcelain in a scratch clone.
    const scratch = join(dir, "scratch");
    execFileSync("git", ["clone", "-q", repo, scratch]);
    execFileSync("sh", ["-c", changeScript(n)], { cwd: scratch });
    const runs = o.quick ? 5 : 15;
    const floor: number[] = [];
    for (let i = 0; i <= runs; i++) {
      git(scratch, "reset", "-q", "--mixed", seed);
      const t = performance.now();
      const r = await run(["sh", "-c", "git add -A && git commit -q -m change"], {
        cwd: scratch,
        env: GIT_ENV,
      });
      if (r.exitCode !== 0) throw new Error(`git commit floor failed: ${r.stderr}`);
      if (i > 0) floor.push(performance.now() - t);
    }

    const w = await pyro.createWorkspace({ backend: "bwrap", seedPath: repo });
    const ch = await pyro.execWorkspace(w.workspace_id, changeScript(n));
    if (ch.exit_code !== 0) throw new Error(`the change failed: ${ch.stderr}`);
    const times: number[] = [];
    for (let i = 0; i <= runs; i++) {
      const t = performance.now();
      const c = await pyro.commitWorkspace(w.workspace_id, { branch: `bench/${i}` });
      if (i > 0) times.push(performance.now() - t);
      if (c.files.length !== 2 * n) throw new Error(`expected ${2 * n} changed files, got ${c.files.length}`);
    }
    await pyro.deleteWorkspace(w.workspace_id);
    const f = median(floor);
    const v = median(times);
    o.log(
      `bench: commit of ${2 * n} changed files ${v.toFixed(1)} ms, git add -A && git commit ${f.toFixed(1)} ms`,
    );
    return [
      row(
        `workspace commit, ${2 * n} changed files, bwrap`,
        v,
        "git add -A && git commit (scratch clone)",
        f,
        {},
      ),
    ];
  } finally {
    await pyro.close();
    await rm(dir, { recursive: true, force: true });
  }
}
