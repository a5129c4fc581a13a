import { spawn } from "node:child_process";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { SandboxState } from "../../../src/backends/backend.js";
import { CgroupLimits, detectCgroups } from "../../../src/backends/linux/cgroups.js";
import { reapSpares } from "../../../src/core/pool.js";
import { PYRO_BIN, pyro } from "../../helpers/cli.js";
import { poolOwnerScript, poolProbe, spareState as spareStateOf, sparesOf } from "../../helpers/pool.js";
import {
  bwrapSkipReason,
  exited,
  type Harness,
  mountsMentioning,
  openHarness,
  processAlive,
  suiteTitle,
  waitUntil,
  writeTree,
} from "../../helpers/sandbox.js";

/**
 * The pool of started sandboxes (core/pool.ts, backends/bwrap/pool.ts): a create takes a
 * spare that was started before it and gives it the workspace's identity in place. The
 * workspace must not be able to tell: its hostname, cgroup and limits, /workspace, its
 * snapshots and net directories are its own, a reset and a restart work as on a sandbox
 * it started, and nothing of the spare is left on the host.
 */
const skip = bwrapSkipReason();
const POOL_ENV = { PYRO_POOL: "1", PYRO_BACKEND: "bwrap" };

/** The memory limit of a sandbox's cgroup in bytes, or null without one. */
async function cgroupMemoryLimit(id: string): Promise<number | null> {
  const cg = await CgroupLimits.attach(await detectCgroups(), id);
  const dir = cg?.dirs.get("unified") ?? cg?.dirs.get("memory");
  if (!dir) return null;
  const file = cg?.dirs.has("unified") ? "memory.max" : "memory.limit_in_bytes";
  return Number((await readFile(join(dir, file), "utf8")).trim());
}

const spareState = (home: string, id: string) => spareStateOf<SandboxState & { pid: number }>(home, id);

describe.skipIf(skip !== "")(suiteTitle("bwrap pool of started sandboxes", skip), () => {
  let h: Harness;
  let seed: string;
  const { sh, createEvent, declined, watchDeclines } = poolProbe(() => h);

  beforeAll(async () => {
    h = await openHarness("pool", { backend: "bwrap" }, { env: POOL_ENV });
    watchDeclines();
    seed = join(await h.tempDir("pool-seed"), "seed");
    await writeTree(seed, { "hello.txt": "hello\n", "src/a.txt": "a\n" });
    await h.pyro.engine.warmPool();
    await h.pyro.engine.pool.ready();
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("hands a started spare to a create, which becomes the workspace's sandbox in every respect", async () => {
    const [spare] = await sparesOf(h.home);
    expect(spare).toMatch(/^spare_/);
    const spareLaunch = (await spareState(h.home, spare!)).pid;
    const w = await h.create({ seedPath: seed, memoryMib: 768 });
    const id = w.workspace_id;
    expect(createEvent(id)?.sandbox, declined.join("; ")).toBe("pool");
    // The spare's sandbox, not a new one: the recorded launch process is the spare's.
    const recorded = h.pyro.engine.store().getWorkspace(id)?.runtime.sandbox as { pid: number } | undefined;
    expect(recorded?.pid).toBe(spareLaunch);
    expect(await sh(id, "hostname")).toBe(`pyro-${id.slice(3, 15)}`);
    expect(await sh(id, "cat hello.txt src/a.txt; pwd")).toBe("hello\na\n/workspace");
    expect(await sh(id, "ls -A /run/pyro/snapshots")).toBe("baseline");
    // The cgroup is the workspace's, with its limits; the spare's name is gone.
    expect(await cgroupMemoryLimit(id)).toBe(768 * 1024 * 1024);
    expect(await CgroupLimits.attach(await detectCgroups(), spare!)).toBeNull();
    // What the sandbox sees of the host stays read-only, and /workspace is mounted as always.
    expect(await sh(id, "touch /run/pyro/snapshots/x 2>&1 || echo refused")).toMatch(/refused$/);
    expect(await sh(id, "touch /run/pyro/net/x 2>&1 || echo refused")).toMatch(/refused$/);
    expect(await sh(id, "awk '$5 == \"/workspace\" {print $6}' /proc/self/mountinfo | tail -1")).toMatch(
      /nosuid,nodev/,
    );
    // The spare's directory left the pool; the host's mounts moved with the workspace.
    expect(await sparesOf(h.home)).not.toContain(spare);
    expect(mountsMentioning(join(h.home, "pool", spare!))).toEqual([]);
  });

  it("keeps its snapshots and resets in place, onto the baseline and onto a named snapshot", async () => {
    await h.pyro.engine.pool.ready();
    const id = (await h.create({ seedPath: seed })).workspace_id;
    expect(createEvent(id)?.sandbox, declined.join("; ")).toBe("pool");
    const epoch = await sh(id, "cut -d' ' -f22 /proc/1/stat");
    await sh(id, "echo one > one.txt");
    await h.pyro.createSnapshot(id, "first");
    expect(await sh(id, "ls /run/pyro/snapshots | sort | tr '\\n' ' '")).toBe("baseline first");
    await sh(id, "echo two > two.txt && rm hello.txt");
    expect((await h.pyro.diffWorkspace(id, { snapshot: "first" })).entries.map((f) => f.path).sort()).toEqual(
      ["hello.txt", "two.txt"],
    );
    await h.pyro.resetWorkspace(id, { snapshot: "first" });
    expect(await sh(id, "ls | tr '\\n' ' '")).toBe("hello.txt one.txt src");
    await h.pyro.resetWorkspace(id);
    expect(await sh(id, "ls | tr '\\n' ' '")).toBe("hello.txt src");
    // Both in place: the sandbox the spare started is still the one running.
    expect(await sh(id, "cut -d' ' -f22 /proc/1/stat")).toBe(epoch);
    // A stop and start gives it a sandbox of its own, on its files.
    await sh(id, "echo kept > kept.txt");
    await h.pyro.stopWorkspace(id);
    await h.pyro.startWorkspace(id);
    expect(await sh(id, "cat kept.txt; hostname")).toBe(`kept\npyro-${id.slice(3, 15)}`);
  });

  it("refills after a take, gives each workspace a spare of its own, and leaves what does not fit to a start", async () => {
    await h.pyro.engine.pool.ready();
    const [spare] = await sparesOf(h.home);
    expect(h.pyro.engine.pool.readyCount).toBe(1);
    // A disk size other than the spares' default: a sandbox of its own; the spare stays.
    const own = (await h.create({ seedPath: seed, diskMib: 2048 })).workspace_id;
    expect(createEvent(own)?.sandbox).toBe("started");
    expect(await sparesOf(h.home)).toEqual([spare]);
    const a = (await h.create({ seedPath: seed })).workspace_id;
    await h.pyro.engine.pool.ready();
    const b = (await h.create({ seedPath: seed })).workspace_id;
    expect([createEvent(a)?.sandbox, createEvent(b)?.sandbox], declined.join("; ")).toEqual(["pool", "pool"]);
    await sh(a, "echo mine > /workspace/a-only.txt && echo x > /tmp/a-tmp");
    expect(await sh(b, "ls /workspace /tmp | grep -c a- || true")).toBe("0");
    expect(await sh(a, "hostname")).not.toBe(await sh(b, "hostname"));
  });

  it("a spare whose agent died is not handed out: the create starts its own sandbox and the spare is gone", async () => {
    await h.pyro.engine.pool.ready();
    const [spare] = await sparesOf(h.home);
    const state = (await spareState(h.home, spare!)) as SandboxState & { pid: number; agent_pid: number };
    process.kill(state.agent_pid, "SIGKILL");
    expect(await waitUntil(() => !processAlive(state.agent_pid), 10_000)).toBe(true);
    const id = (await h.create({ seedPath: seed })).workspace_id;
    expect(createEvent(id)?.sandbox).toBe("started");
    expect(await sh(id, "hostname; cat hello.txt")).toBe(`pyro-${id.slice(3, 15)}\nhello`);
    expect(await sparesOf(h.home)).not.toContain(spare);
    expect(processAlive(state.pid)).toBe(false);
    expect(await CgroupLimits.attach(await detectCgroups(), spare!)).toBeNull();
    expect(mountsMentioning(join(h.home, "pool", spare!))).toEqual([]);
  });

  it("is on for `pyro mcp serve` by default, and a server that exits ends its spare", async () => {
    const home = await h.tempDir("pool-serve");
    const env: NodeJS.ProcessEnv = { ...process.env, PYRO_BACKEND: "bwrap", PYRO_HOME: home, PYRO_DEBUG: "" };
    delete env.PYRO_POOL;
    env.PYRO_ENV_CACHE = h.cliEnv.PYRO_ENV_CACHE;
    const server = spawn(process.execPath, [PYRO_BIN, "mcp", "serve"], {
      env,
      stdio: ["pipe", "pipe", "pipe"],
    });
    try {
      // The spare is recorded with its state once it has started.
      const started = await waitUntil(async () => {
        const [id] = await sparesOf(home);
        return id !== undefined && (await spareState(home, id).catch(() => undefined)) !== undefined;
      }, 60_000);
      expect(started).toBe(true);
      const [spare] = await sparesOf(home);
      const launch = (await spareState(home, spare!)).pid;
      expect(processAlive(launch)).toBe(true);
      // The host closes the server's stdin: the server exits and takes its spare with it.
      server.stdin.end();
      await new Promise((r) => server.once("exit", r));
      expect(processAlive(launch)).toBe(false);
      expect(await sparesOf(home)).toEqual([]);
      expect(mountsMentioning(home)).toEqual([]);
    } finally {
      server.kill("SIGKILL");
    }
  });

  it("ends its spares when closed, and spares whose owner was killed are ended by the next pool", async () => {
    // An owner process that keeps one spare, then is SIGKILLed (a killed `mcp serve`).
    const script = poolOwnerScript();
    const home = await h.tempDir("pool-owner");
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
    // Left behind, and shown as such.
    const report = await h.pyro.doctor();
    expect(report.pool.serve_size).toBe(1);
    const { Pyro } = await import("../../../src/sdk/pyro.js");
    const next = new Pyro({ home, environmentsDir: String(h.cliEnv.PYRO_ENV_CACHE), env });
    try {
      const before = (await next.doctor()).pool.spares;
      expect(before).toEqual([expect.objectContaining({ id: spare, owner_alive: false, backend: "bwrap" })]);
      await next.engine.warmPool();
      await next.engine.pool.ready();
      // The dead owner's spare is ended and removed; the new pool has one of its own.
      expect(processAlive(launch)).toBe(false);
      expect(await CgroupLimits.attach(await detectCgroups(), spare!)).toBeNull();
      const now = await sparesOf(home);
      expect(now).toHaveLength(1);
      expect(now).not.toContain(spare);
    } finally {
      await next.close();
    }
    // Closing ended the new pool's spare too: nothing left on the host.
    expect(await sparesOf(home)).toEqual([]);
    expect(mountsMentioning(home)).toEqual([]);
  });
  it("a server killed at any moment of a hand-out leaves every workspace usable or gone, and nothing of its spares", {
    timeout: 300_000,
  }, async () => {
    const home = await h.tempDir("pool-chaos");
    const env = { ...process.env, ...POOL_ENV, PYRO_HOME: home, PYRO_ENV_CACHE: h.cliEnv.PYRO_ENV_CACHE };
    const script = poolOwnerScript([
      "console.log('creating');",
      "const w = await pyro.createWorkspace({ backend: 'bwrap' });",
      "console.log('created ' + w.workspace_id);",
    ]);
    const seen = new Set<string>();
    for (const [i, delayMs] of [0, 5, 15, 30, 60, 120].entries()) {
      const where = `iteration ${i} (killed ${delayMs} ms into the create)`;
      const child = spawn(process.execPath, ["--input-type=module", "-e", script], { env, stdio: "pipe" });
      let out = "";
      child.stdout.on("data", (d: Buffer) => {
        out += d.toString();
      });
      expect(await waitUntil(() => out.includes("creating"), 60_000), where).toBe(true);
      await new Promise((r) => setTimeout(r, delayMs));
      child.kill("SIGKILL");
      await exited(child);
      for (const id of await sparesOf(home)) seen.add(id);
      // The next client (a CLI call, no pool) finds each workspace usable or cleanly gone.
      const list = pyro(["workspace", "list", "--json"], env);
      expect(list.code, `${where}: ${list.stderr}`).toBe(0);
      for (const w of list.json().workspaces as { workspace_id: string; state: string }[]) {
        seen.add(w.workspace_id);
        expect(["running", "stopped"], `${where}: ${w.workspace_id} is ${w.state}`).toContain(w.state);
        if (w.state === "stopped") expect(pyro(["workspace", "start", w.workspace_id], env).code).toBe(0);
        const r = pyro(["workspace", "exec", w.workspace_id, "--", "hostname"], env);
        expect(r.stdout.trim(), `${where}: ${r.stderr}`).toBe(`pyro-${w.workspace_id.slice(3, 15)}`);
        expect(pyro(["workspace", "delete", w.workspace_id], env).code).toBe(0);
      }
      // The next pool ends the dead owner's spares (and, closed, its own).
      const { Pyro } = await import("../../../src/sdk/pyro.js");
      const next = new Pyro({
        home,
        environmentsDir: String(env.PYRO_ENV_CACHE),
        env: { ...env, PYRO_POOL: "0" },
      });
      await reapSpares({ dir: join(home, "pool"), backend: (n) => next.engine.backend(n) });
      await next.close();
      expect(await sparesOf(home), where).toEqual([]);
    }
    const layout = await detectCgroups();
    for (const id of seen) expect(await CgroupLimits.attach(layout, id), `cgroup of ${id}`).toBeNull();
    expect(mountsMentioning(home)).toEqual([]);
  });
});
