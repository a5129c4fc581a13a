import { spawn } from "node:child_process";
import { existsSync, readdirSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { poolOwnerScript, poolProbe, spareState as spareStateOf, sparesOf } from "../../helpers/pool.js";
import {
  gvisorSkipReason,
  type Harness,
  mountsMentioning,
  openHarness,
  processAlive,
  suiteTitle,
  waitUntil,
  writeTree,
} from "../../helpers/sandbox.js";

/**
 * The pool of started sandboxes on gVisor (core/pool.ts, backends/gvisor/pool.ts): an
 * unseeded create with the default limits takes a spare started before it, which takes
 * the workspace's identity (hostname, cgroup, directories); anything else starts its own.
 * The workspace must not be able to tell, and nothing of a spare may be left on the host.
 */
const skip = gvisorSkipReason();
const POOL_ENV = { PYRO_POOL: "1", PYRO_BACKEND: "gvisor" };
const CGROUP_ROOT = "/sys/fs/cgroup";

const spareState = (home: string, id: string) => spareStateOf<{ pid: number; cgroup: string }>(home, id);

/** The cgroup directories named `name` in every hierarchy (pyro's and runsc's). */
function cgroupsNamed(name: string): string[] {
  return readdirSync(CGROUP_ROOT)
    .flatMap((h) => [join(CGROUP_ROOT, h, "pyro", name), join(CGROUP_ROOT, "pyro", name)])
    .filter((d, i, all) => existsSync(d) && all.indexOf(d) === i);
}

describe.skipIf(skip !== "")(suiteTitle("gvisor pool of started sandboxes", skip), () => {
  let h: Harness;
  let seed: string;
  const { sh, createEvent, declined, watchDeclines, ...probe } = poolProbe(() => h);
  const recorded = (id: string) => probe.recorded<{ pid: number; cgroup: string }>(id);

  beforeAll(async () => {
    h = await openHarness("gvisor-pool", { backend: "gvisor" }, { env: POOL_ENV });
    watchDeclines();
    seed = join(await h.tempDir("gvisor-pool-seed"), "seed");
    await writeTree(seed, { "hello.txt": "hello\n" });
    await h.pyro.engine.warmPool();
    await h.pyro.engine.pool.ready();
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("hands a started spare to an unseeded create, which becomes the workspace's sandbox", async () => {
    const [spare] = await sparesOf(h.home);
    expect(spare).toMatch(/^spare_/);
    const before = await spareState(h.home, spare!);
    const id = (await h.create()).workspace_id;
    expect(createEvent(id)?.sandbox, declined.join("; ")).toBe("pool");
    // The spare's sandbox, not a new one: the recorded launch process is the spare's.
    expect(recorded(id).pid).toBe(before.pid);
    expect(recorded(id).cgroup).toBe(id);
    expect(await sh(id, "hostname; cat /proc/sys/kernel/hostname")).toBe(
      `pyro-${id.slice(3, 15)}\npyro-${id.slice(3, 15)}`,
    );
    expect(await sh(id, "ls -A /workspace; pwd; ls -A /run/pyro/snapshots")).toBe("/workspace\nbaseline");
    // Every cgroup of the spare (pyro's and runsc's) is the workspace's now, with its limits.
    expect(cgroupsNamed(spare!)).toEqual([]);
    expect(cgroupsNamed(id).length).toBeGreaterThanOrEqual(3);
    const limit = await readFile(join(CGROUP_ROOT, "memory", "pyro", id, "memory.limit_in_bytes"), "utf8");
    expect(Number(limit)).toBe(1024 * 1024 * 1024);
    expect(await sh(id, "grep MemTotal /proc/meminfo")).toMatch(/ 1048576 kB$/);
    // What the sandbox sees of the host stays read-only.
    expect(await sh(id, "touch /run/pyro/snapshots/x 2>&1 || echo refused")).toMatch(/refused$/);
    expect(await sparesOf(h.home)).not.toContain(spare);
    expect(mountsMentioning(join(h.home, "pool", spare!))).toEqual([]);
    // Its snapshots, diff, resets and a stop and start work as on a sandbox it started.
    await sh(id, "echo one > one.txt");
    await h.pyro.createSnapshot(id, "first");
    await sh(id, "echo two > two.txt");
    expect((await h.pyro.diffWorkspace(id, { snapshot: "first" })).entries.map((f) => f.path)).toEqual([
      "two.txt",
    ]);
    await h.pyro.resetWorkspace(id, { snapshot: "first" });
    expect(await sh(id, "ls | tr '\\n' ' '")).toBe("one.txt");
    await h.pyro.resetWorkspace(id);
    expect(await sh(id, "ls -A | wc -l")).toBe("0");
    await sh(id, "echo kept > kept.txt");
    await h.pyro.stopWorkspace(id);
    expect(processAlive(before.pid)).toBe(false);
    await h.pyro.startWorkspace(id);
    expect(await sh(id, "cat kept.txt; hostname")).toBe(`kept\npyro-${id.slice(3, 15)}`);
  });

  it("leaves a seeded create and one with other limits to a start of their own", async () => {
    await h.pyro.engine.pool.ready();
    const seeded = (await h.create({ seedPath: seed })).workspace_id;
    expect(createEvent(seeded)?.sandbox).toBe("started");
    expect(declined.at(-1)).toMatch(/seed/);
    expect(await sh(seeded, "cat hello.txt; hostname")).toBe(`hello\npyro-${seeded.slice(3, 15)}`);
    await h.pyro.engine.pool.ready();
    // An unseeded create between them: declines are counted in a row.
    const pooled = (await h.create()).workspace_id;
    expect(createEvent(pooled)?.sandbox, declined.join("; ")).toBe("pool");
    await h.pyro.engine.pool.ready();
    const big = (await h.create({ memoryMib: 768 })).workspace_id;
    expect(createEvent(big)?.sandbox).toBe("started");
    expect(await sh(big, "grep MemTotal /proc/meminfo")).toMatch(/ 786432 kB$/);
    // Two workspaces from spares share nothing.
    await h.pyro.engine.pool.ready();
    const other = (await h.create()).workspace_id;
    expect(createEvent(other)?.sandbox, declined.join("; ")).toBe("pool");
    await sh(pooled, "echo mine > a-only.txt && echo x > /tmp/a-tmp");
    expect(await sh(other, "ls /workspace /tmp | grep -c a- || true")).toBe("0");
  });

  it("a spare whose sandbox died is not handed out: the create starts its own and the spare is gone", async () => {
    await h.pyro.engine.pool.ready();
    const [spare] = await sparesOf(h.home);
    const state = await spareState(h.home, spare!);
    process.kill(state.pid, "SIGKILL");
    expect(await waitUntil(() => !processAlive(state.pid), 10_000)).toBe(true);
    const id = (await h.create()).workspace_id;
    expect(createEvent(id)?.sandbox).toBe("started");
    expect(await sh(id, "hostname")).toBe(`pyro-${id.slice(3, 15)}`);
    expect(await sparesOf(h.home)).not.toContain(spare);
    expect(cgroupsNamed(spare!)).toEqual([]);
    expect(mountsMentioning(join(h.home, "pool", spare!))).toEqual([]);
  });

  it("spares whose owner was killed are ended by the next pool, leaving nothing", async () => {
    const script = poolOwnerScript();
    const home = await h.tempDir("gvisor-pool-owner");
    const env = { ...process.env, ...POOL_ENV, PYRO_HOME: home, PYRO_ENV_CACHE: h.cliEnv.PYRO_ENV_CACHE };
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], { env, stdio: "pipe" });
    let out = "";
    child.stdout.on("data", (d: Buffer) => {
      out += d.toString();
    });
    await waitUntil(() => out.includes("ready"), 60_000);
    expect(out).toContain("ready 1");
    const [spare] = await sparesOf(home);
    const launch = (await spareState(home, spare!)).pid;
    expect(processAlive(launch)).toBe(true);
    child.kill("SIGKILL");
    await new Promise((r) => child.once("exit", r));
    const { Pyro } = await import("../../../src/sdk/pyro.js");
    const next = new Pyro({ home, environmentsDir: String(h.cliEnv.PYRO_ENV_CACHE), env });
    try {
      await next.engine.warmPool();
      await next.engine.pool.ready();
      expect(processAlive(launch)).toBe(false);
      expect(cgroupsNamed(spare!)).toEqual([]);
      expect(await sparesOf(home)).not.toContain(spare);
    } finally {
      await next.close();
    }
    expect(await sparesOf(home)).toEqual([]);
    expect(mountsMentioning(home)).toEqual([]);
  });
});
