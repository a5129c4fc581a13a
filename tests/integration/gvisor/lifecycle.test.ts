import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pyro as cli } from "../../helpers/cli.js";
import { expectSweptOnceStale, startOwner } from "../../helpers/owner.js";
import {
  entriesOf,
  errorOf,
  gvisorSkipReason,
  type Harness,
  hostProcesses,
  mountsMentioning,
  openHarness,
  processAlive,
  sandboxPid,
  suiteTitle,
  waitUntil,
  writeTree,
} from "../../helpers/sandbox.js";

/**
 * One-shot runs, and one gVisor workspace followed across processes: created by one CLI
 * process, used by others, stopped and started, restarted after its sandbox died, and
 * deleted without leaving a runsc process, a mount, a cgroup or a file behind.
 */
const skip = gvisorSkipReason();
const CGROUP_ROOT = "/sys/fs/cgroup";

/** Every cgroup directory named after `id` under pyro's base, in any hierarchy. */
function cgroupsOf(id: string): string[] {
  const found: string[] = [];
  for (const h of readdirSync(CGROUP_ROOT)) {
    for (const dir of [join(CGROUP_ROOT, h, "pyro", id), join(CGROUP_ROOT, "pyro", id)]) {
      if (existsSync(dir) && !found.includes(dir)) found.push(dir);
    }
  }
  return found;
}

const runscOf = (needle: string) => hostProcesses((argv) => argv.some((a) => a.includes(needle)));

describe.skipIf(skip !== "")(suiteTitle("gvisor one-shots and a workspace across processes", skip), () => {
  let h: Harness;
  let env: NodeJS.ProcessEnv;
  let id = "";

  beforeAll(async () => {
    h = await openHarness("gvisor-life", { backend: "gvisor" });
    env = { ...h.cliEnv, PYRO_BACKEND: "gvisor" };
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("runs a one-shot command and leaves no workspace, directory, mount, runsc process or cgroup", async () => {
    const r = await h.pyro.run("debian:12", "git --version; uname -r", { backend: "gvisor" });
    expect(r).toMatchObject({ backend: "gvisor", exit_code: 0, timed_out: false, truncated: false });
    expect(r.stdout).toMatch(/^git version \d+\.\d+.*\n4\.4\.0\n$/);
    expect((await h.pyro.listWorkspaces()).count).toBe(0);
    expect(await entriesOf(join(h.home, "workspaces"))).toEqual([]);
    expect(mountsMentioning(h.home)).toEqual([]);
    expect(runscOf(h.home)).toEqual([]);
    // runsc's own groups (blkio, devices, freezer, ...: bwrap never makes those) are gone too;
    // pyro's memory/cpu/pids groups cannot be told apart from other suites' one-shots here.
    expect(runscOnlyOneShotGroups()).toEqual([]);
  });

  // gVisor-specific: a one-shot killed at its timeout leaves no runsc process. Its results,
  // stdin, cap and timeout are the parity suite's (tests/parity/exec.ts, "one-shot run").
  it("a one-shot killed at its timeout leaves no runsc process", async () => {
    const slow = await h.pyro.run("debian:12", "sleep 100", { backend: "gvisor", timeoutSeconds: 2 });
    expect(slow).toMatchObject({ timed_out: true, exit_code: 124 });
    expect(runscOf(h.home)).toEqual([]);
  });

  it("pyro run --backend gvisor prints the command's output through the CLI", () => {
    const r = cli(["run", "debian:12", "--backend", "gvisor", "--", "git", "--version"], h.cliEnv);
    expect([r.code, r.stderr]).toEqual([0, ""]);
    expect(r.stdout).toMatch(/^git version \d+\.\d+\.\d+\n$/);
  });

  // gVisor-specific: the same runsc sandbox process outlives its creator and serves the others
  // (a killed creator, a command killed with its CLI: the parity suite's "resume" and "exec").
  it("keeps running after the CLI process that created it exits, and serves other processes", async () => {
    const seed = join(await h.tempDir("gvisor-life-seed"), "seed");
    await writeTree(seed, { "keep.txt": "kept\n" });
    const created = cli(
      ["workspace", "create", "debian:12", "--seed-path", seed, "--name", "resumable", "--id-only"],
      env,
    );
    expect(created.code, created.stderr).toBe(0);
    id = created.stdout.trim();
    expect((await h.pyro.getWorkspace(id)).backend).toBe("gvisor");
    const pid = sandboxPid(h.pyro, id);
    expect(pid !== null && processAlive(pid), `sandbox of ${id} died with its creator`).toBe(true);

    const ran = cli(
      ["workspace", "exec", "resumable", "--", "sh", "-c", "echo from-b > b.txt; cat keep.txt"],
      env,
    );
    expect([ran.code, ran.stdout], ran.stderr).toEqual([0, "kept\n"]);
    expect((await h.pyro.readWorkspaceFile(id, "b.txt")).content).toBe("from-b\n");
    expect(sandboxPid(h.pyro, id)).toBe(pid);
  });

  // gVisor-specific: the sandbox's process and every runsc process end on stop (that files,
  // the root's writes and workspace_stopped hold is the parity suite's too).
  it("keeps its files across stop and start, and refuses work while stopped", async () => {
    await h.pyro.writeWorkspaceFile(id, "before-stop.txt", "written just before the stop\n");
    await h.pyro.execWorkspace(id, "echo root-layer > /root/note.txt");
    const pid = sandboxPid(h.pyro, id)!;
    expect((await h.pyro.stopWorkspace(id)).state).toBe("stopped");
    expect(processAlive(pid)).toBe(false);
    expect(runscOf(join(h.home, "workspaces", id))).toEqual([]);
    expect((await errorOf(h.pyro.execWorkspace(id, "true"))).code).toBe("workspace_stopped");
    expect((await h.pyro.startWorkspace(id)).state).toBe("running");
    const r = await h.pyro.execWorkspace(id, "cat before-stop.txt keep.txt b.txt /root/note.txt");
    expect(r.stdout, r.stderr).toBe("written just before the stop\nkept\nfrom-b\nroot-layer\n");
  });

  it("restarts a sandbox that died while no process was attached, on its kept files", async () => {
    const pid = sandboxPid(h.pyro, id)!;
    await h.pyro.close();
    process.kill(pid, "SIGKILL");
    expect(await waitUntil(() => !processAlive(pid), 10_000), `sandbox ${pid} survived SIGKILL`).toBe(true);
    const next = cli(["workspace", "exec", id, "--", "cat", "before-stop.txt"], env, 60_000);
    expect([next.code, next.stdout], next.stderr).toEqual([0, "written just before the stop\n"]);
    const restarted = sandboxPid(h.pyro, id);
    expect(restarted).not.toBe(pid);
    expect(processAlive(restarted!)).toBe(true);
  });

  it("is deleted leaving no record, directory, runsc process, mount or cgroup", async () => {
    const pid = sandboxPid(h.pyro, id)!;
    const dir = join(h.home, "workspaces", id);
    expect(cgroupsOf(id).length).toBeGreaterThan(0);
    expect(await h.pyro.deleteWorkspace("resumable")).toMatchObject({ workspace_id: id, deleted: true });
    expect((await errorOf(h.pyro.getWorkspace(id))).code).toBe("workspace_not_found");
    expect(processAlive(pid)).toBe(false);
    expect(runscOf(dir)).toEqual([]);
    expect(runscOf(h.home)).toEqual([]);
    expect(mountsMentioning(h.home)).toEqual([]);
    expect(cgroupsOf(id)).toEqual([]);
    expect(existsSync(dir)).toBe(false);
  });

  // In this file, after the one-shot checks above: runsc's own groups of a run in flight
  // would be in their way (they look at every run_ group of the host).
  it("ends a one-shot's runsc, sandbox and gofer with its owner; a later sweep removes what is left", async () => {
    const home = await h.tempDir("gvisor-cold-owner");
    const owner = startOwner([
      `const pyro = new Pyro({ home: ${JSON.stringify(home)}, environmentsDir: ${JSON.stringify(String(h.cliEnv.PYRO_ENV_CACHE))}, pool: 0 });`,
      "await pyro.run('debian:12', 'echo started; exec sleep 300', { backend: 'gvisor', timeoutSeconds: 600, onOutput: () => console.log('running') });",
    ]);
    expect(await owner.printed("running", 90_000), owner.output()).toBe(true);
    const scratch = join(home, "oneshot");
    const [run] = readdirSync(scratch).filter((n) => n.startsWith("run_"));
    expect(run).toBeDefined();
    // The command runs inside the sentry: what the host sees of the run is runsc's processes.
    const runsc = () => runscOf(join(scratch, run!));
    expect(runsc().length).toBeGreaterThanOrEqual(2);
    await owner.kill();
    expect(await waitUntil(() => runsc().length === 0, 15_000)).toBe(true);
    await expectSweptOnceStale(scratch, run!);
    // runsc's own groups of the run (blkio, devices, freezer, ...) went with the sweep too.
    expect(cgroupsOf(run!)).toEqual([]);
  });
});

/** One-shot groups in hierarchies where only runsc creates groups (not pyro's memory/cpu/pids). */
function runscOnlyOneShotGroups(): string[] {
  return readdirSync(CGROUP_ROOT)
    .filter((c) => !["memory", "cpu", "pids", "unified"].includes(c))
    .flatMap((c) => entriesOfSync(join(CGROUP_ROOT, c, "pyro")).map((e) => `${c}/${e}`))
    .filter((e) => e.includes("/run_"));
}

function entriesOfSync(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}
