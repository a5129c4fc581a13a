import { existsSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pyro as cli } from "../../helpers/cli.js";
import {
  containerIdOf,
  containersLabelled,
  dockerSkipReason,
  type TestEngine,
  useTestEngine,
} from "../../helpers/docker.js";
import { type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";

/**
 * Docker-specific: a reset hands the workspace over to a standby container started ahead
 * of it (src/backends/docker/standby.ts), and discards exactly what a restart discards.
 * That the reset's outcome is the same as on every backend is the parity suite's
 * (tests/parity/snapshots.ts); this suite proves the hand-out happened and that no standby
 * or old container outlives a stop or a delete.
 */
const skip = dockerSkipReason();

/** Leaves something behind in every place a reset must empty. */
const MESS = [
  "echo w > w.txt",
  "echo t > /tmp/t",
  "echo s > /dev/shm/s",
  "echo k > /run/pyro/sock/leftover",
  // A System V shared memory segment (a C-less way: python is not in debian:12; ipcmk is).
  "ipcmk -M 4096 >/dev/null",
  // A process that outlives its call (nohup: the agent's hangup spares it).
  "nohup sleep 1000 >/dev/null 2>&1 &",
].join("; ");

/** What of the mess is still there, from inside the workspace. */
const LOOK = [
  "ls -A /workspace /tmp /dev/shm",
  "ls /run/pyro/sock",
  "tail -n +2 /proc/sysvipc/shm | wc -l",
  "cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^sleep$' || true",
].join("; ");

describe.skipIf(skip !== "")(suiteTitle("docker resets through a standby container", skip), () => {
  let engine: TestEngine;
  let h: Harness;
  let id = "";

  beforeAll(async () => {
    engine = await useTestEngine();
    h = await openHarness("docker-standby", { backend: "docker" }, { env: engine.env });
    id = (await h.pyro.createWorkspace({ backend: "docker" })).workspace_id;
  });
  afterAll(async () => {
    await h?.cleanup();
    await engine?.release();
  });

  /** Waits until the standby of the workspace's next reset exists (it is being started). */
  async function standbyStarted(name: string): Promise<void> {
    for (let i = 0; i < 400; i++) {
      const c = await engine.docker
        .getContainer(name)
        .inspect()
        .catch(() => null);
      if (c?.State.Running) return;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(`no standby container ${name} after 20 s`);
  }

  async function gone(ref: string): Promise<boolean> {
    for (let i = 0; i < 200; i++) {
      const c = await engine.docker
        .getContainer(ref)
        .inspect()
        .catch(() => null);
      if (!c) return true;
      await new Promise((r) => setTimeout(r, 50));
    }
    return false;
  }

  it("makes no standby for a CLI call's reset (it would outlive the call for nothing)", async () => {
    const reset = cli(["workspace", "reset", id, "--json"], h.cliEnv);
    expect(reset.code, reset.stderr).toBe(0);
    // Longer than the standby's delay: a CLI process that waited for its timer would have
    // started one by now, and one that exited left none.
    await new Promise((r) => setTimeout(r, 1500));
    expect((await containersLabelled(engine.docker, "dev.pyro.workspace", id)).map((c) => c.Names)).toEqual([
      [`/pyro-${id}`],
    ]);
  });

  it("hands a reset over to a container started before it, which discards what a restart does", async () => {
    const clean = (await h.pyro.execWorkspace(id, LOOK)).stdout;
    expect((await h.pyro.execWorkspace(id, MESS)).exit_code).toBe(0);
    // The first reset restarts (this process had no standby) and then makes one.
    await h.pyro.resetWorkspace(id);
    expect((await h.pyro.execWorkspace(id, LOOK)).stdout).toBe(clean);
    await standbyStarted(`pyro-${id}-b`);
    const before = containerIdOf(h.pyro, id)!;
    expect((await h.pyro.execWorkspace(id, MESS)).exit_code).toBe(0);
    expect((await h.pyro.execWorkspace(id, LOOK)).stdout).not.toBe(clean);
    const asked = Date.now();
    await h.pyro.resetWorkspace(id);
    const after = containerIdOf(h.pyro, id)!;
    expect(after).not.toBe(before);
    const c = await engine.docker.getContainer(after).inspect();
    expect(c.Name).toBe(`/pyro-${id}-b`);
    // Started before the reset was asked for: the hand-out, not a restart.
    expect(Date.parse(c.State.StartedAt)).toBeLessThan(asked);
    expect((await h.pyro.execWorkspace(id, LOOK)).stdout).toBe(clean);
    // The old container (paused at the hand-out) is removed after it.
    expect(await gone(before)).toBe(true);
  });

  it("counts a sandbox recorded mid hand-out as not running (a process that died there)", async () => {
    const backend = h.pyro.engine.backend("docker");
    const state = h.pyro.engine.store().getWorkspace(id)!.runtime.sandbox!;
    expect(await backend.isRunning(state)).toBe(true);
    expect(await backend.isRunning({ ...state, in_place_reset: true })).toBe(false);
  });

  it("restarts when the standby died, with the same outcome", async () => {
    await standbyStarted(`pyro-${id}`);
    await engine.docker.getContainer(`pyro-${id}`).kill();
    expect((await h.pyro.execWorkspace(id, MESS)).exit_code).toBe(0);
    const asked = Date.now();
    await h.pyro.resetWorkspace(id);
    const c = await engine.docker.getContainer(containerIdOf(h.pyro, id)!).inspect();
    expect(Date.parse(c.State.StartedAt)).toBeGreaterThanOrEqual(asked - 1000);
    expect((await h.pyro.execWorkspace(id, "ls -A; ls /tmp; ls /dev/shm")).stdout).toBe("");
  });

  it("removes the standby on stop, reads the stopped slot's files, and starts the same container again", async () => {
    // A hand-out to whichever slot is not current, then files written there.
    const name = (await engine.docker.getContainer(containerIdOf(h.pyro, id)!).inspect()).Name.slice(1);
    const other = name.endsWith("-b") ? `pyro-${id}` : `pyro-${id}-b`;
    await standbyStarted(other);
    await h.pyro.resetWorkspace(id);
    const current = containerIdOf(h.pyro, id)!;
    expect((await engine.docker.getContainer(current).inspect()).Name).toBe(`/${other}`);
    await h.pyro.writeWorkspaceFile(id, "marker.txt", "in the handed-out slot\n");
    await standbyStarted(name);
    await h.pyro.stopWorkspace(id);
    expect(await gone(name)).toBe(true);
    // The disk reader of a stopped workspace mounts the current slot's volume.
    expect((await h.pyro.readWorkspaceDisk(id, "marker.txt")).content).toBe("in the handed-out slot\n");
    await h.pyro.startWorkspace(id);
    expect(containerIdOf(h.pyro, id)).toBe(current);
  });

  it("keeps a published port working through a hand-out (the helper reads the new state)", async () => {
    const w = await h.pyro.createWorkspace({
      backend: "docker",
      publishedPorts: [{ host_port: 0, guest_port: 18080 }],
    });
    const port = w.published_ports[0]!.host_port;
    const serve = () =>
      h.pyro.execWorkspace(
        w.workspace_id,
        `setsid -f /run/pyro/runtime/bin/node -e 'require("http").createServer((q, r) => r.end("in " + q.url)).listen(18080, "127.0.0.1")' >/dev/null 2>&1; ` +
          `bash -c 'for i in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/18080) 2>/dev/null && break; sleep 0.1; done'`,
      );
    const get = () =>
      fetch(`http://127.0.0.1:${port}/x`).then(
        (r) => r.text(),
        () => "refused",
      );
    try {
      await h.pyro.resetWorkspace(w.workspace_id);
      await standbyStarted(`pyro-${w.workspace_id}-b`);
      await h.pyro.resetWorkspace(w.workspace_id);
      expect((await engine.docker.getContainer(containerIdOf(h.pyro, w.workspace_id)!).inspect()).Name).toBe(
        `/pyro-${w.workspace_id}-b`,
      );
      await serve();
      expect(await get()).toBe("in /x");
    } finally {
      await h.pyro.deleteWorkspace(w.workspace_id);
    }
  });

  it("is deleted leaving no container or volume of either slot", async () => {
    await h.pyro.resetWorkspace(id);
    const dir = join(h.home, "workspaces", id);
    await h.pyro.deleteWorkspace(id);
    expect(await containersLabelled(engine.docker, "dev.pyro.workspace", id)).toEqual([]);
    const volumes = (await engine.docker.listVolumes()).Volumes ?? [];
    expect(volumes.filter((v) => v.Name.includes(id))).toEqual([]);
    expect(existsSync(dir)).toBe(false);
  });
});
