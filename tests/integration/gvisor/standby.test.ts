import { spawn } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pyro as cli } from "../../helpers/cli.js";
import {
  entriesOf,
  exited,
  gvisorSkipReason,
  type Harness,
  hostProcesses,
  mountsMentioning,
  openHarness,
  processAlive,
  sandboxPid,
  suiteTitle,
  waitUntil,
} from "../../helpers/sandbox.js";

/**
 * gVisor-specific: a reset hands the workspace over to a standby sandbox started ahead of
 * it (src/backends/gvisor/standby.ts), and discards exactly what a restart discards. That
 * a reset's outcome is the same on every backend is the parity suite's
 * (tests/parity/snapshots.ts); this suite proves the hand-out happened (the sandbox after
 * the reset is the one started before it was asked for), that it keeps the workspace's
 * identity and limits, and that no standby outlives a stop, a delete or its owner.
 */
const skip = gvisorSkipReason();
const CGROUP_ROOT = "/sys/fs/cgroup";
const SDK = new URL("../../../dist/sdk/pyro.js", import.meta.url).pathname;

/** Leaves something behind in every place a reset must empty. */
const MESS = [
  "echo w > w.txt",
  "echo t > /tmp/t",
  "echo s > /dev/shm/s",
  "echo k > /run/pyro/sock/leftover",
  "ipcmk -M 4096 >/dev/null",
  // A process that outlives its call (nohup: the agent's hangup spares it).
  "nohup sleep 1000 >/dev/null 2>&1 &",
].join("; ");

/** What of the mess is still there, and the workspace's identity and limits, from inside. */
const LOOK = [
  "ls -A /workspace /tmp /dev/shm",
  "ls /run/pyro/sock | grep -v '^agent'",
  "ipcs -m | grep -c '^0x' || true",
  "cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^sleep$' || true",
  "hostname",
  "grep MemTotal /proc/meminfo",
].join("; ");

/** Every cgroup directory of a workspace's standbys (`<id>-s<token>`), in any hierarchy. */
function standbyCgroups(id: string): string[] {
  const found: string[] = [];
  for (const h of readdirSync(CGROUP_ROOT)) {
    for (const base of [join(CGROUP_ROOT, h, "pyro"), join(CGROUP_ROOT, "pyro")]) {
      let names: string[] = [];
      try {
        names = readdirSync(base);
      } catch {
        continue;
      }
      for (const n of names)
        if (n.startsWith(`${id}-s`) && !found.includes(join(base, n))) found.push(join(base, n));
    }
  }
  return found;
}

/** The processes a cgroup of pyro's lists (the pids hierarchy), or [] when it is gone. */
function cgroupPids(name: string): number[] {
  try {
    return readFileSync(join(CGROUP_ROOT, "pids", "pyro", name, "cgroup.procs"), "utf8")
      .split("\n")
      .filter(Boolean)
      .map(Number);
  } catch {
    return [];
  }
}

describe.skipIf(skip !== "")(suiteTitle("gvisor resets through a standby sandbox", skip), () => {
  let h: Harness;
  let id = "";
  const wsDir = () => join(h.home, "workspaces", id);
  const standbyDirs = async () =>
    (await entriesOf(join(wsDir(), "gvisor-standby"))).filter((e) => e.startsWith("s-"));
  const recorded = () =>
    h.pyro.engine.store().getWorkspace(id)!.runtime.sandbox as { cgroup: string; pid: number };

  /** Waits until a standby's agent listens; its token. */
  async function standbyReady(): Promise<string> {
    let token = "";
    const ok = await waitUntil(async () => {
      const [d] = await standbyDirs();
      token = d?.slice(2) ?? "";
      return d !== undefined && existsSync(join(wsDir(), "gvisor-standby", d, "sockfs/sock/agent.sock"));
    }, 60_000);
    if (!ok) throw new Error(`no standby of ${id} after 60 s`);
    return token;
  }

  beforeAll(async () => {
    h = await openHarness("gvisor-standby", { backend: "gvisor" });
    id = (await h.create({ memoryMib: 384 })).workspace_id;
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("makes no standby for a CLI call's reset (it would outlive the call for nothing)", async () => {
    const reset = cli(["workspace", "reset", id, "--json"], h.cliEnv, 60_000);
    expect(reset.code, reset.stderr).toBe(0);
    // Longer than the standby's delay: a CLI process that waited for its timer would have
    // started one by now, and one that exited left none.
    await new Promise((r) => setTimeout(r, 1500));
    expect(await standbyDirs()).toEqual([]);
    expect(standbyCgroups(id)).toEqual([]);
  });

  it("hands a reset over to a sandbox started before it, which discards what a restart does", async () => {
    const clean = (await h.pyro.execWorkspace(id, LOOK)).stdout;
    expect(clean).toContain(`pyro-${id.slice(3, 15)}\n`);
    expect((await h.pyro.execWorkspace(id, MESS)).exit_code).toBe(0);
    expect((await h.pyro.execWorkspace(id, LOOK)).stdout).not.toBe(clean);
    // The first reset of this process restarts (no standby yet) and then makes one.
    await h.pyro.resetWorkspace(id);
    expect((await h.pyro.execWorkspace(id, LOOK)).stdout).toBe(clean);
    const token = await standbyReady();
    const startedBefore = cgroupPids(`${id}-s${token}`);
    expect(startedBefore.length).toBeGreaterThan(0);
    const old = recorded();
    expect((await h.pyro.execWorkspace(id, MESS)).exit_code).toBe(0);
    await h.pyro.resetWorkspace(id);
    // The sandbox now recorded is the standby: its cgroup, and a process started before the reset.
    expect(recorded().cgroup).toBe(`${id}-s${token}`);
    expect(startedBefore).toContain(recorded().pid);
    // Every process of the old sandbox is gone by the answer, its cgroup with them.
    expect(processAlive(old.pid)).toBe(false);
    expect(existsSync(join(CGROUP_ROOT, "pids", "pyro", old.cgroup))).toBe(false);
    expect((await h.pyro.execWorkspace(id, LOOK)).stdout).toBe(clean);
    // The limits are the workspace's (cgroup and the guest's MemTotal above).
    const limit = readFileSync(
      join(CGROUP_ROOT, "memory", "pyro", recorded().cgroup, "memory.limit_in_bytes"),
    );
    expect(Number(String(limit))).toBe(384 * 1024 * 1024);
    expect((await h.pyro.getWorkspace(id)).workspace_id).toBe(id);
  });

  it("counts a sandbox recorded mid hand-out as not running (a process that died there)", async () => {
    const backend = h.pyro.engine.backend("gvisor");
    const state = h.pyro.engine.store().getWorkspace(id)!.runtime.sandbox!;
    expect(await backend.isRunning(state)).toBe(true);
    expect(await backend.isRunning({ ...state, in_place_reset: true })).toBe(false);
  });

  it("restarts when the standby died, with the same outcome", async () => {
    const token = await standbyReady();
    const standbyPids = cgroupPids(`${id}-s${token}`);
    for (const pid of standbyPids) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // gone already (killing one of them ends others)
      }
    }
    expect((await h.pyro.execWorkspace(id, MESS)).exit_code).toBe(0);
    await h.pyro.resetWorkspace(id);
    expect(standbyPids).not.toContain(recorded().pid);
    expect(recorded().cgroup).toBe(id);
    expect((await h.pyro.execWorkspace(id, "ls -A; ls /tmp; ls /dev/shm")).stdout).toBe("");
  });

  it("ends the standby on stop, and keeps the handed-out sandbox's files across stop and start", async () => {
    await standbyReady();
    await h.pyro.resetWorkspace(id);
    await h.pyro.writeWorkspaceFile(id, "marker.txt", "in the handed-out sandbox\n");
    const token = await standbyReady();
    await h.pyro.stopWorkspace(id);
    expect(standbyCgroups(id)).toEqual([]);
    expect(await standbyDirs()).toEqual([]);
    expect(existsSync(join(wsDir(), "gvisor-standby", `s-${token}`))).toBe(false);
    expect((await h.pyro.readWorkspaceDisk(id, "marker.txt")).content).toBe("in the handed-out sandbox\n");
    await h.pyro.startWorkspace(id);
    expect((await h.pyro.readWorkspaceFile(id, "marker.txt")).content).toBe("in the handed-out sandbox\n");
  });

  it("reaps a standby whose owner died, and the workspace keeps working", async () => {
    const script = join(await h.tempDir("gvisor-standby-owner"), "owner.mjs");
    await writeFile(
      script,
      `import { Pyro } from ${JSON.stringify(SDK)};
const pyro = new Pyro({ home: process.env.PYRO_HOME, environmentsDir: process.env.PYRO_ENV_CACHE });
await pyro.resetWorkspace(${JSON.stringify(id)});
process.stdout.write("reset\\n");
setInterval(() => {}, 1000);
`,
    );
    const owner = spawn(process.execPath, [script], {
      env: { ...process.env, ...h.cliEnv },
      stdio: ["ignore", "pipe", "inherit"],
    });
    let out = "";
    owner.stdout?.on("data", (c: Buffer) => {
      out += String(c);
    });
    try {
      expect(await waitUntil(() => out.includes("reset"), 60_000)).toBe(true);
      const token = await standbyReady();
      const pids = cgroupPids(`${id}-s${token}`);
      expect(pids.length).toBeGreaterThan(0);
      owner.kill("SIGKILL");
      await exited(owner);
      expect(
        await waitUntil(() => standbyCgroups(id).length === 0, 30_000),
        `standby cgroups left: ${standbyCgroups(id)}`,
      ).toBe(true);
      expect(await waitUntil(async () => (await standbyDirs()).length === 0, 10_000)).toBe(true);
      for (const pid of pids) expect(processAlive(pid)).toBe(false);
      expect(mountsMentioning(`gvisor-standby/s-${token}`)).toEqual([]);
    } finally {
      owner.kill("SIGKILL");
    }
    expect((await h.pyro.execWorkspace(id, "echo alive")).stdout).toBe("alive\n");
  });

  it("an owner killed at any moment of a hand-out leaves the workspace usable and no stray sandbox", {
    timeout: 300_000,
  }, async () => {
    const script = join(await h.tempDir("gvisor-standby-killed"), "owner.mjs");
    await writeFile(
      script,
      `import { Pyro } from ${JSON.stringify(SDK)};
const pyro = new Pyro({ home: process.env.PYRO_HOME, environmentsDir: process.env.PYRO_ENV_CACHE });
const id = ${JSON.stringify(id)};
await pyro.resetWorkspace(id);
await pyro.execWorkspace(id, "echo mess > mess.txt; nohup sleep 1000 >/dev/null 2>&1 &");
process.stdout.write("ready\\n");
process.stdin.once("data", () => void pyro.resetWorkspace(id));
setInterval(() => {}, 1000);
`,
    );
    for (const delayMs of [0, 10, 40, 120]) {
      const owner = spawn(process.execPath, [script], {
        env: { ...process.env, ...h.cliEnv },
        stdio: ["pipe", "pipe", "inherit"],
      });
      let out = "";
      owner.stdout?.on("data", (c: Buffer) => {
        out += String(c);
      });
      try {
        expect(await waitUntil(() => out.includes("ready"), 60_000)).toBe(true);
        await standbyReady();
        owner.stdin?.write("go\n");
        await new Promise((r) => setTimeout(r, delayMs));
      } finally {
        owner.kill("SIGKILL");
        await exited(owner);
      }
      // Whatever the moment: the workspace answers from this process, on its own identity,
      // its files either as before the reset or reset (a reset killed after it ended the
      // old sandbox's processes but before the hand-out leaves a restart on the kept files).
      const seen = await h.pyro.execWorkspace(
        id,
        "hostname; ls; cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^sleep$' || true",
      );
      expect(seen.stdout, `killed ${delayMs} ms into the reset`).toMatch(
        new RegExp(`^pyro-${id.slice(3, 15)}\n(mess.txt\n[01]\n|0\n)$`),
      );
      // Every sandbox cgroup of the workspace is the one recorded (a standby it did not
      // take is ended by its watchdog or by the next start).
      const current = recorded().cgroup;
      expect(
        await waitUntil(() => standbyCgroups(id).every((d) => d.endsWith(`/${current}`)), 30_000),
        `stray standby cgroups after a kill at ${delayMs} ms: ${standbyCgroups(id)}`,
      ).toBe(true);
      await h.pyro.resetWorkspace(id);
    }
  });

  it("is deleted leaving no standby, watchdog, cgroup, mount or directory", async () => {
    await h.pyro.resetWorkspace(id);
    await standbyReady();
    await h.pyro.deleteWorkspace(id);
    expect(standbyCgroups(id)).toEqual([]);
    expect(existsSync(join(CGROUP_ROOT, "pids", "pyro", id))).toBe(false);
    expect(hostProcesses((argv) => argv.some((a) => a.includes(id)))).toEqual([]);
    expect(mountsMentioning(id)).toEqual([]);
    expect(existsSync(wsDir())).toBe(false);
  });
});
