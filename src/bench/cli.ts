import { spawn } from "node:child_process";
import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { statFields } from "../backends/common.js";
import { run } from "../util/run.js";
import { type BenchRow, median, round, row } from "./stats.js";

/** The CLI as a user runs it (bin/pyro.js over dist/). */
const CLI_ENTRY = fileURLToPath(new URL("../../bin/pyro.js", import.meta.url));

/** Runs argv to its end with no output kept: its wall time; rejects on a non-zero exit. */
export function timeProcess(argv: string[], env: NodeJS.ProcessEnv): Promise<number> {
  return new Promise((resolve, reject) => {
    const t = performance.now();
    const child = spawn(argv[0]!, argv.slice(1), { env, stdio: ["ignore", "ignore", "pipe"] });
    let stderr = "";
    child.stderr.on("data", (c: Buffer) => {
      stderr += c.toString("utf8");
    });
    child.on("error", reject);
    child.on("exit", (code) => {
      const wallMs = performance.now() - t;
      if (code !== 0) return reject(new Error(`${argv.join(" ")} exited ${code}: ${stderr.slice(-500)}`));
      resolve(wallMs);
    });
  });
}

/**
 * CPU time of this process's reaped children so far (utime + stime, /proc/self/stat):
 * Node does not give a child's rusage, so a run's CPU is the difference around it.
 */
export async function childrenCpuMs(): Promise<number> {
  const stat = await readFile("/proc/self/stat", "utf8");
  // Fields after the command name (which may hold spaces): cutime, cstime are 16 and 17.
  const f = statFields(stat);
  const ticks = Number(f[13]) + Number(f[14]);
  return ticks * 10; // USER_HZ is 100 on Linux
}

/**
 * Several commands timed alternately (so load changes hit them alike), `runs` times each
 * after one untimed warm-up: per label, wall and CPU samples.
 */
export async function alternate(
  commands: Record<string, string[]>,
  runs: number,
  env: NodeJS.ProcessEnv,
): Promise<Record<string, { wall: number[]; cpu: number[] }>> {
  const out: Record<string, { wall: number[]; cpu: number[] }> = {};
  for (const [label, argv] of Object.entries(commands)) {
    await timeProcess(argv, env);
    out[label] = { wall: [], cpu: [] };
  }
  for (let i = 0; i < runs; i++) {
    for (const [label, argv] of Object.entries(commands)) {
      const before = await childrenCpuMs();
      const wallMs = await timeProcess(argv, env);
      out[label]!.wall.push(wallMs);
      out[label]!.cpu.push((await childrenCpuMs()) - before);
    }
  }
  return out;
}

/**
 * The CLI as whole processes (issue 18: a user meets the CLI, so its start counts):
 * `pyro --version` and `pyro workspace list` against `node -e 0`, and `pyro run` of a
 * one-shot on bwrap against the bare bwrap spawn, all in one alternating measurement.
 */
export async function cliRows(o: {
  quick: boolean;
  home: string;
  /** The bare bwrap argv of the run floor, or null when bwrap is not there. */
  bwrapTrue: string[] | null;
  log: (s: string) => void;
}): Promise<BenchRow[]> {
  const env = { ...process.env, PYRO_HOME: o.home, PYRO_DEBUG: "" };
  const node = process.execPath;
  const commands: Record<string, string[]> = {
    node: [node, "-e", "0"],
    version: [node, CLI_ENTRY, "--version"],
    list: [node, CLI_ENTRY, "workspace", "list"],
  };
  if (o.bwrapTrue) {
    commands.bwrap = o.bwrapTrue;
    commands.run = [node, CLI_ENTRY, "run", "debian:12", "--backend", "bwrap", "--", "true"];
    // The nearest peer as a whole process (issue 18's floor of this row): sandbox-runtime.
    if (await srtWorks()) commands.srt = [SRT_BIN, "true"];
  }
  o.log("bench: CLI processes");
  const t = await alternate(commands, o.quick ? 7 : 20, env);
  const cpu = (label: string) => `CPU ${round(median(t[label]!.cpu))} ms`;
  const rows = [
    row(
      "CLI: pyro --version (whole process)",
      t.version!.wall,
      "node -e 0",
      t.node!.wall,
      { max: 1.5 },
      cpu("version"),
    ),
    row(
      "CLI: pyro workspace list (whole process)",
      t.list!.wall,
      "node -e 0",
      t.node!.wall,
      { max: 2 },
      cpu("list"),
    ),
  ];
  if (t.run && t.srt)
    rows.push(
      row(
        "CLI: pyro run debian:12 --backend bwrap -- true vs sandbox-runtime (whole processes)",
        t.run.wall,
        "srt true",
        t.srt.wall,
        { max: 0.5 },
        `${cpu("run")}; srt ${cpu("srt")}`,
      ),
    );
  if (t.run && t.bwrap)
    rows.push(
      row(
        "CLI: pyro run debian:12 --backend bwrap -- true (whole process)",
        t.run.wall,
        "bwrap /bin/true",
        t.bwrap.wall,
        {},
        `${cpu("run")}; node -e 0 ${round(median(t.node!.wall))} ms`,
      ),
    );
  return rows;
}

/** sandbox-runtime's CLI (a devDependency): the floor of the `pyro run` row. */
const SRT_BIN = fileURLToPath(new URL("../../node_modules/.bin/srt", import.meta.url));

/** Whether `srt true` runs here (it needs bubblewrap, ripgrep and socat: setup installs them). */
async function srtWorks(): Promise<boolean> {
  const r = await run([SRT_BIN, "true"], { timeoutMs: 30_000 }).catch(() => null);
  return r?.exitCode === 0;
}

/** VmRSS of an idle `node` process (what any Node agent costs at least), in KiB. */
export async function idleNodeRssKib(): Promise<number> {
  const child = spawn(process.execPath, ["-e", "setInterval(() => {}, 1000)"], { stdio: "ignore" });
  try {
    await new Promise((r) => setTimeout(r, 500));
    const status = await readFile(`/proc/${child.pid}/status`, "utf8");
    return Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? Number.NaN);
  } finally {
    child.kill("SIGKILL");
  }
}
