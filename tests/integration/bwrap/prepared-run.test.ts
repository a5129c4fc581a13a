import { existsSync, readdirSync, readFileSync } from "node:fs";
import { readdir } from "node:fs/promises";
import { join } from "node:path";
import { Readable } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { STEP_DEADLINE_SLACK_S } from "../../../src/backends/bwrap/prepared-run.js";
import { CgroupLimits, detectCgroups } from "../../../src/backends/linux/cgroups.js";
import type { Pyro } from "../../../src/sdk/pyro.js";
import { type Owner, startOwner } from "../../helpers/owner.js";
import {
  bwrapSkipReason,
  type Harness,
  hostProcesses,
  mountsMentioning,
  openHarness,
  processAlive,
  suiteTitle,
  waitUntil,
} from "../../helpers/sandbox.js";

/**
 * One-shot runs in a launch prepared after the previous run (backends/bwrap/prepared-run.ts,
 * used when the engine's pool is on): each run must have the isolation of a cold run (disk
 * limit, cgroup limits written before the command, seccomp, namespaces, a fresh writable
 * layer) and nothing of a prepared launch may outlive its owner.
 */
const skip = bwrapSkipReason();

/** The prepared launches under `home`: the run directory and the launch step's pid of each. */
function preparedLaunches(home: string): { id: string; pid: number }[] {
  const dir = join(home, "oneshot");
  return hostProcesses((argv) => argv.includes("pyro-prepared-launch") && argv.some((a) => a.startsWith(dir)))
    .map((p) => ({
      pid: p.pid,
      id: p.argv
        .find((a) => a.startsWith(`${dir}/run_`))!
        .slice(dir.length + 1)
        .split("/")[0]!,
    }))
    .filter((p) => p.id !== undefined);
}

/** What a run directory may have left on the host: cgroups, loop devices, mounts, files. */
async function leftovers(home: string, id: string): Promise<string[] | null> {
  const out: string[] = [];
  if (await CgroupLimits.attach(await detectCgroups(), id)) out.push(`cgroup ${id}`);
  for (const dev of readdirSync("/sys/block").filter((d) => d.startsWith("loop"))) {
    const f = `/sys/block/${dev}/loop/backing_file`;
    if (existsSync(f) && readFileSync(f, "utf8").includes(id)) out.push(`loop device ${dev}`);
  }
  out.push(...mountsMentioning(id));
  if (existsSync(join(home, "oneshot", id))) out.push(`directory ${id}`);
  return out;
}

/**
 * An owner process (an SDK script with the pool on) that made one run, so that a launch is
 * prepared and waiting for the next, then runs `then`.
 */
async function ownerWithLaunch(home: string, env: string, then: string[]): Promise<Owner> {
  const owner = startOwner([
    `const pyro = new Pyro({ home: ${JSON.stringify(home)}, environmentsDir: ${JSON.stringify(env)}, pool: 1 });`,
    "await pyro.run('debian:12', 'true', { backend: 'bwrap' });",
    "await pyro.engine.launches.ready();",
    "console.log('ready');",
    ...then,
  ]);
  expect(await owner.printed("ready", 60_000), owner.output()).toBe(true);
  return owner;
}

describe.skipIf(skip !== "")(suiteTitle("one-shot runs in prepared launches on bwrap", skip), () => {
  let h: Harness;
  let pooled: Pyro;

  beforeAll(async () => {
    h = await openHarness("prepared-run");
    const { Pyro } = await import("../../../src/sdk/pyro.js");
    pooled = new Pyro({ home: h.home, environmentsDir: String(h.cliEnv.PYRO_ENV_CACHE), pool: 1 });
  });
  afterAll(async () => {
    await pooled?.close();
    await h?.cleanup();
  });

  /**
   * Runs `command` in the launch prepared for its options (prepared by a first run if
   * needed); `launch` is the one it took: kept before the run, gone after it.
   */
  async function preparedRun(command: string, options: Parameters<Pyro["run"]>[2] = {}) {
    const { stdin: _, ...rest } = options;
    await pooled.run("debian:12", "true", { backend: "bwrap", ...rest });
    await pooled.engine.launches.ready();
    const before = preparedLaunches(h.home);
    expect(
      before.length,
      `a prepared launch (${pooled.engine.launches.lastError ?? "no error"})`,
    ).toBeGreaterThan(0);
    const r = await pooled.run("debian:12", command, { backend: "bwrap", ...options });
    await pooled.engine.launches.ready();
    const after = preparedLaunches(h.home).map((l) => l.pid);
    const used = before.filter((l) => !after.includes(l.pid));
    expect(used).toHaveLength(1);
    return { r, launch: used[0]! };
  }

  it("runs the command in the launch prepared after the previous run, which then ends and leaves nothing", async () => {
    const { r, launch } = await preparedRun(
      'hostname; printf "%s|" "$A" "$B"; echo "$0"; echo err >&2; exit 3',
      {
        env: { A: "x y\nz", B: "$(touch /tmp/no) '\"" },
      },
    );
    // The hostname is the prepared launch's: this run was its command.
    expect(r.stdout).toBe(`pyro-${launch.id.slice(4, 16)}\nx y\nz|$(touch /tmp/no) '"|/bin/sh\n`);
    expect(r.stderr).toBe("err\n");
    expect(r.exit_code).toBe(3);
    expect(processAlive(launch.pid)).toBe(false);
    expect(await leftovers(h.home, launch.id)).toEqual([]);
    // The next one is prepared (a launch of its own).
    expect(preparedLaunches(h.home).map((l) => l.id)).not.toContain(launch.id);
  });

  it("gives each run a fresh writable layer: what one run wrote is absent in the next", async () => {
    const a = await preparedRun("echo x > /workspace/f; echo y > /etc/f; cat /workspace/f /etc/f");
    expect(a.r.stdout).toBe("x\ny\n");
    const b = await preparedRun("ls /workspace/f /etc/f 2>&1; echo rc=$?");
    expect(b.launch.id).not.toBe(a.launch.id);
    expect(b.r.stdout).toMatch(/No such file[\s\S]*No such file[\s\S]*rc=2\n$/);
  });

  it("keeps the isolation: no network, seccomp, no capabilities, its own pid namespace", async () => {
    const { r } = await preparedRun(
      "grep -E '^(Seccomp|NoNewPrivs|CapEff):' /proc/self/status; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; ls /proc | grep -cE '^[0-9]+$'",
    );
    expect(r.stdout).toMatch(/^CapEff:\s+0+\nNoNewPrivs:\s+1\nSeccomp:\s+2\nlo\n[1-4]\n$/);
  });

  it("starts the command as a cold run does: the same signal dispositions and descriptors", async () => {
    const probe = "grep -E '^Sig(Ign|Blk|Cgt):' /proc/self/status; ls /proc/self/fd | tr '\\n' ' '";
    const { r } = await preparedRun(probe);
    const cold = await h.pyro.run("debian:12", probe, { backend: "bwrap" });
    expect(r.stdout).toBe(cold.stdout);
    // grep catches a signal of its own (SigCgt): blocked and ignored ones are what is inherited.
    expect(r.stdout).toMatch(/^SigBlk:\s+0+\nSigIgn:\s+0+\nSigCgt:\s+[0-9a-f]+\n0 1 2 3 $/);
  });

  it("applies the disk limit: a command filling the layer gets ENOSPC", async () => {
    const { r } = await preparedRun("dd if=/dev/zero of=/workspace/big bs=1M count=200 2>&1; echo rc=$?", {
      diskMib: 64,
    });
    expect(r.stdout).toMatch(/No space left on device[\s\S]*rc=1\n$/);
  });

  it("writes the run's own limits to the cgroup before the command runs, and they hold", async () => {
    // The launch was prepared with the default limits; this run asks for others.
    await pooled.run("debian:12", "true", { backend: "bwrap" });
    await pooled.engine.launches.ready();
    const layout = await detectCgroups();
    const memDirs = new Map<string, string>();
    for (const l of preparedLaunches(h.home)) {
      const cg = await CgroupLimits.attach(layout, l.id);
      memDirs.set(l.id, cg!.dirs.get("unified") ?? cg!.dirs.get("memory")!);
    }
    const memFile = layout.version === 2 ? "memory.max" : "memory.limit_in_bytes";
    const running = pooled.run("debian:12", "sleep 1; dd if=/dev/zero of=/dev/null bs=100M count=1", {
      backend: "bwrap",
      memoryMib: 64,
    });
    // Read while the command sleeps: the limit of the launch running it is the run's.
    const procs = (d: string) => readFileSync(join(d, "cgroup.procs"), "utf8").trim().split("\n").length;
    let used: string | undefined;
    await waitUntil(() => {
      used = [...memDirs.values()].find((d) => procs(d) >= 3);
      return used !== undefined;
    }, 5000);
    expect(used).toBeDefined();
    expect(readFileSync(join(used!, memFile), "utf8").trim()).toBe(String(64 * 1024 * 1024));
    const r = await running;
    expect(r.exit_code).toBe(137); // dd's 100 MiB buffer: killed by the OOM killer
  });

  it("passes stdin through to the command", async () => {
    const { r } = await preparedRun("cat; echo done", { stdin: Readable.from(["hello\n", "world\n"]) });
    expect(r.stdout).toBe("hello\nworld\ndone\n");
  });

  it("kills a command at its timeout, and its launch leaves nothing", async () => {
    const started = Date.now();
    const { r, launch } = await preparedRun("sleep 30 & sleep 30", { timeoutSeconds: 1 });
    expect(r).toMatchObject({ exit_code: 124, timed_out: true });
    expect(Date.now() - started).toBeLessThan(10_000);
    expect(processAlive(launch.pid)).toBe(false);
    expect(await leftovers(h.home, launch.id)).toEqual([]);
  });

  it("leaves nothing when its owner closes or is killed while it waits", async () => {
    // Closed: the engine's close ends the waiting launch.
    const { Pyro } = await import("../../../src/sdk/pyro.js");
    const home = await h.tempDir("prepared-owner");
    const env = String(h.cliEnv.PYRO_ENV_CACHE);
    const closed = new Pyro({ home, environmentsDir: env, pool: 1 });
    await closed.run("debian:12", "true", { backend: "bwrap" });
    await closed.engine.launches.ready();
    const [a] = preparedLaunches(home);
    expect(a).toBeDefined();
    await closed.close();
    expect(processAlive(a!.pid)).toBe(false);
    expect(await leftovers(home, a!.id)).toEqual([]);
    // Killed: its launch sees its gate close and removes what it made.
    const owner = await ownerWithLaunch(home, env, ["setInterval(() => {}, 1000);"]);
    const [b] = preparedLaunches(home);
    expect(b).toBeDefined();
    await owner.kill();
    expect(await waitUntil(() => !processAlive(b!.pid), 10_000)).toBe(true);
    expect(await leftovers(home, b!.id)).toEqual([]);
    expect(await readdir(join(home, "oneshot"))).toEqual([]);
  });

  it("leaves nothing when its owner is killed while the command runs: the launch step cleans up after it", async () => {
    const home = await h.tempDir("prepared-owner-run");
    const env = String(h.cliEnv.PYRO_ENV_CACHE);
    const owner = await ownerWithLaunch(home, env, [
      "await pyro.run('debian:12', 'echo started; sleep 2', { backend: 'bwrap', onOutput: () => console.log('running') });",
    ]);
    const [launch] = preparedLaunches(home);
    expect(launch).toBeDefined();
    expect(await owner.printed("running", 30_000), owner.output()).toBe(true);
    await owner.kill();
    // The command finishes (nothing kills it), then the step unmounts and removes its cgroup.
    expect(await waitUntil(() => !processAlive(launch!.pid), 15_000)).toBe(true);
    expect(await leftovers(home, launch!.id)).toEqual([]);
  });

  it("ends a command past its timeout when its owner was killed mid-run: the step's own deadline", async () => {
    // The owner's timer would have ended it at 4 s; killed before that, only the step can
    // (4 s + slack). (An owner killed after its own timer fired is the sweep's case.)
    const home = await h.tempDir("prepared-owner-deadline");
    const env = String(h.cliEnv.PYRO_ENV_CACHE);
    const marker = `298.${process.pid}${Date.now() % 1000}`;
    const owner = await ownerWithLaunch(home, env, [
      `await pyro.run('debian:12', 'echo started; exec sleep ${marker}', { backend: 'bwrap', timeoutSeconds: 4 });`,
    ]);
    const [launch] = preparedLaunches(home);
    expect(launch).toBeDefined();
    const sleeper = () => hostProcesses((argv) => argv[0] === "sleep" && argv.includes(marker));
    expect(await waitUntil(() => sleeper().length === 1, 30_000)).toBe(true);
    await owner.kill();
    const t = Date.now();
    // Alive past the owner's death (nothing else ends it), then gone by the step's deadline.
    await new Promise((ok) => setTimeout(ok, 500));
    expect(sleeper()).toHaveLength(1);
    expect(await waitUntil(() => sleeper().length === 0, 20_000)).toBe(true);
    expect(Date.now() - t).toBeLessThan((4 + STEP_DEADLINE_SLACK_S) * 1000 + 5_000);
    expect(await waitUntil(() => !processAlive(launch!.pid), 15_000)).toBe(true);
    expect(await leftovers(home, launch!.id)).toEqual([]);
  });

  it("runs nothing for a run cancelled before it started, cold or prepared (red-team review)", async () => {
    // The backends' abort listeners are added once the launch is set up: an abort that came
    // earlier fired none, and the command ran to its end.
    await pooled.run("debian:12", "true", { backend: "bwrap" });
    await pooled.engine.launches.ready();
    const before = preparedLaunches(h.home).map((l) => l.pid);
    expect(before.length).toBeGreaterThan(0);
    for (const pyro of [pooled, h.pyro]) {
      const r = pyro.run("debian:12", "echo ran", { backend: "bwrap", signal: AbortSignal.abort() });
      await expect(r).rejects.toMatchObject({ code: "cancelled" });
    }
    // The waiting launch was not taken.
    expect(preparedLaunches(h.home).map((l) => l.pid)).toEqual(before);
  });

  it("releases nothing when a prepared run is aborted after the core's check (during its limit writes)", async () => {
    await pooled.run("debian:12", "true", { backend: "bwrap" });
    await pooled.engine.launches.ready();
    const before = preparedLaunches(h.home);
    // The backend directly, as the core calls it once its own check has passed.
    const backend = await pooled.engine.loadBackend("bwrap");
    const env = await pooled.engine.environments.pull("debian:12");
    const run = backend.runOnce!({
      rootfs: env.rootfs,
      scratchDir: join(h.home, "oneshot"),
      runtimeCacheDir: join(h.home, "runtime"),
      command: "echo ran",
      env: {},
      // Limits other than the prepared ones: the run writes them before its gate.
      limits: { vcpus: 1, memory_mib: 512, pids_max: 256, disk_mib: 10 * 1024 },
      timeoutMs: 10_000,
      maxOutputBytes: 1024,
      signal: AbortSignal.abort(),
      keep: pooled.engine.launches,
    });
    await expect(run).rejects.toMatchObject({ code: "cancelled" });
    await pooled.engine.launches.ready();
    const after = preparedLaunches(h.home).map((l) => l.pid);
    const taken = before.filter((l) => !after.includes(l.pid));
    expect(taken).toHaveLength(1);
    expect(await leftovers(h.home, taken[0]!.id)).toEqual([]);
  });
});
