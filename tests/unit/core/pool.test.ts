import { existsSync, readdirSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import type { SandboxSpec, SandboxState, WorkspaceBackend } from "../../../src/backends/backend.js";
import { BwrapBackend } from "../../../src/backends/bwrap/backend.js";
import { procStartTime } from "../../../src/backends/common.js";
import { FakeBackend } from "../../../src/backends/fake/backend.js";
import { Engine } from "../../../src/core/engine.js";
import { reapSpares, SandboxPool, spareRootfsSync } from "../../../src/core/pool.js";
import { fakePyro } from "../../helpers/engine.js";

/**
 * What the pool's records tell the rest of the engine (core/pool.ts); the pool itself
 * runs real bwrap spares in tests/integration/bwrap/pool.test.ts.
 */
describe("pool records", () => {
  let home: string;
  beforeEach(async () => {
    home = await mkdtemp(join(tmpdir(), "pyro-pool-unit-"));
    await mkdir(join(home, "pool", "spare_a"), { recursive: true });
    const record = (rootfs: string) =>
      JSON.stringify({ owner: { pid: 1, start_time: "1" }, backend: "bwrap", spec: { rootfs } });
    await writeFile(join(home, "pool", "spare_a.json"), record("/envs/a/rootfs"));
    await writeFile(join(home, "pool", "spare_b.taken.json"), record("/envs/b/rootfs"));
    // Neither a record nor a finished one: a temp file and a damaged record.
    await writeFile(join(home, "pool", ".spare_c.json.123.ab.tmp"), record("/envs/c/rootfs"));
    await writeFile(join(home, "pool", "spare_d.json"), "{");
  });
  afterEach(async () => {
    await rm(home, { recursive: true, force: true });
  });

  it("name the environments spares run on, taken or not", () => {
    expect([...spareRootfsSync(join(home, "pool"))].sort()).toEqual(["/envs/a/rootfs", "/envs/b/rootfs"]);
    expect(spareRootfsSync(join(home, "missing")).size).toBe(0);
  });

  it("keep a spare's environment from being pruned", async () => {
    const engine = new Engine({ home, environmentsDir: join(home, "envs"), env: {} });
    try {
      const inUse = (engine as unknown as { rootfsInUse(): Set<string> }).rootfsInUse();
      expect(inUse.has("/envs/a/rootfs")).toBe(true);
      expect(inUse.has("/envs/b/rootfs")).toBe(true);
    } finally {
      await engine.close();
    }
  });
});

/**
 * The reaper (reapSpares) removes only what a dead pool left: it must never reach past
 * `<home>/pool/<id>` (a record names paths and a cgroup, a directory can be a link) nor
 * remove the spare another live pool is starting while it runs.
 */
describe("pool reaper", () => {
  let home: string;
  let pool: string;
  const dead = { pid: 1, start_time: "1" };
  const writeRecord = (id: string, record: object) =>
    writeFile(join(pool, `${id}.json`), JSON.stringify(record));
  const specOf = (id: string) => ({
    workspace_id: id,
    dir: join(pool, id, "sandbox"),
    rootfs: "/envs/a/rootfs",
    snapshotsDir: join(pool, id, "snapshots"),
    snapshot: ".spare-empty",
    limits: { vcpus: 1, memory_mib: 512, pids_max: 512, disk_mib: 10240 },
    appDir: "/app",
    runtimeCacheDir: "/rt",
  });
  beforeEach(async () => {
    home = await mkdtemp(join(tmpdir(), "pyro-pool-reap-"));
    pool = join(home, "pool");
    await mkdir(pool, { recursive: true });
  });
  afterEach(async () => {
    await rm(home, { recursive: true, force: true });
  });

  it("leaves alone a live pool's spare made while it reaped a dead one", async () => {
    await writeRecord("spare_00000000dead", {
      owner: dead,
      backend: "bwrap",
      spec: specOf("spare_00000000dead"),
    });
    const live = { pid: process.pid, start_time: String(await procStartTime(process.pid)) };
    // Another process's pool starts a spare meanwhile: its record, then its directory.
    const backend = {
      destroy: async () => {
        await writeRecord("spare_00000000beef", {
          owner: live,
          backend: "bwrap",
          spec: specOf("spare_00000000beef"),
        });
        await mkdir(join(pool, "spare_00000000beef", "sandbox"), { recursive: true });
      },
    } as unknown as WorkspaceBackend;
    await reapSpares({ dir: pool, backend: () => backend });
    expect(existsSync(join(pool, "spare_00000000beef", "sandbox"))).toBe(true);
    expect(existsSync(join(pool, "spare_00000000beef.json"))).toBe(true);
    expect(existsSync(join(pool, "spare_00000000dead.json"))).toBe(false);
  });

  it("ends a dead spare by its own id and paths, never by what its record names", async () => {
    const outside = join(home, "outside");
    await mkdir(join(outside, "sandbox"), { recursive: true });
    await writeFile(join(outside, "sandbox", "keep.txt"), "keep\n");
    const spec = { ...specOf("spare_0000000000aa"), workspace_id: "ws_other", dir: join(outside, "sandbox") };
    const state = { backend: "bwrap", pid: 1, start_time: "1", cgroup: "ws_other", socket: "/s", log: "/l" };
    await writeRecord("spare_0000000000aa", { owner: dead, backend: "bwrap", spec, state });
    // A record under a name the pool never gives (a workspace's id) ends nothing.
    await writeRecord("ws_other", { owner: dead, backend: "bwrap", spec: specOf("ws_other") });
    const calls: { spec: SandboxSpec; state: SandboxState | null }[] = [];
    const backend = {
      destroy: async (s: SandboxSpec, st: SandboxState | null) => {
        calls.push({ spec: s, state: st });
        await rm(s.dir, { recursive: true, force: true });
      },
    } as unknown as WorkspaceBackend;
    await reapSpares({ dir: pool, backend: () => backend });
    expect(readFileSync(join(outside, "sandbox", "keep.txt"), "utf8")).toBe("keep\n");
    expect(calls).toHaveLength(1);
    expect(calls[0]!.spec.workspace_id).toBe("spare_0000000000aa");
    expect(calls[0]!.spec.dir).toBe(join(pool, "spare_0000000000aa", "sandbox"));
    expect(calls[0]!.state).toBeNull();
    expect(existsSync(join(pool, "spare_0000000000aa.json"))).toBe(false);
    expect(existsSync(join(pool, "ws_other.json"))).toBe(false);
  });

  it("is run by any process that reaps, not only one with a pool on", async () => {
    // A killed `mcp serve` left a spare; a CLI-only user's next listing ends it.
    const f = await fakePyro();
    try {
      const dir = join(f.home, "pool");
      await mkdir(join(dir, "spare_00000000dead", "sandbox"), { recursive: true });
      const spec = { ...specOf("spare_00000000dead"), dir: join(dir, "spare_00000000dead", "sandbox") };
      await writeFile(
        join(dir, "spare_00000000dead.json"),
        JSON.stringify({ owner: dead, backend: "bwrap", spec }),
      );
      await f.pyro.listWorkspaces();
      expect(readdirSync(dir)).toEqual([]);
    } finally {
      await f.cleanup();
    }
  });

  it("removes a link planted as a spare's directory without following it", async () => {
    const outside = join(home, "outside");
    await mkdir(join(outside, "sandbox"), { recursive: true });
    await writeFile(join(outside, "sandbox", "keep.txt"), "keep\n");
    await writeFile(join(outside, "keep.txt"), "keep\n");
    await symlink(outside, join(pool, "spare_0000000001ed"));
    await symlink(outside, join(pool, "spare_bare"));
    await writeRecord("spare_0000000001ed", {
      owner: dead,
      backend: "bwrap",
      spec: specOf("spare_0000000001ed"),
    });
    const backend = new BwrapBackend();
    await reapSpares({ dir: pool, backend: () => backend });
    expect(readFileSync(join(outside, "sandbox", "keep.txt"), "utf8")).toBe("keep\n");
    expect(readFileSync(join(outside, "keep.txt"), "utf8")).toBe("keep\n");
    expect(readdirSync(pool)).toEqual([]);
  });
});

/** The pool itself on the fake backend (a real agent in this process, no isolation). */
describe("pool hand-out", () => {
  let home: string;
  /** The sandbox spec of a new workspace number `n`, on the pool's environment. */
  const wsSpec = (n: number): SandboxSpec => ({
    workspace_id: `ws_${String(n).padStart(12, "0")}`,
    dir: join(home, `ws${n}`, "sandbox"),
    rootfs: "/envs/a/rootfs",
    snapshotsDir: join(home, `ws${n}`, "snapshots"),
    snapshot: "baseline",
    limits: { vcpus: 1, memory_mib: 512, pids_max: 512, disk_mib: 10 * 1024 },
    appDir: "/app",
    runtimeCacheDir: "/rt",
  });
  beforeEach(async () => {
    home = await mkdtemp(join(tmpdir(), "pyro-pool-take-"));
  });
  afterEach(async () => {
    await rm(home, { recursive: true, force: true });
  });

  it("a spare whose record is gone is not handed out: the create starts its own and the spare ends", async () => {
    const fake = Object.assign(new FakeBackend(), {
      adoptSpare: vi.fn(async (): Promise<SandboxState | { declined: string }> => ({ declined: "unused" })),
    });
    const dir = join(home, "pool");
    const pool = new SandboxPool({
      size: 1,
      dir,
      appDir: "/app",
      runtimeCacheDir: "/rt",
      backend: () => fake,
    });
    try {
      pool.want(fake, "/envs/a/rootfs");
      await pool.ready();
      expect(pool.readyCount).toBe(1);
      const [file] = readdirSync(dir).filter((n) => n.endsWith(".json"));
      const state = JSON.parse(readFileSync(join(dir, file!), "utf8")).state as SandboxState;
      expect(await fake.isRunning(state)).toBe(true);
      // Its record lost (a user's rm, say): the hand-out cannot mark it taken.
      await rm(join(dir, file!));
      const spec = wsSpec(1);
      await expect(pool.take(fake, spec)).resolves.toBeNull();
      expect(fake.adoptSpare).not.toHaveBeenCalled();
      expect(await fake.isRunning(state)).toBe(false);
      expect(existsSync(join(dir, file!.replace(/\.json$/, "")))).toBe(false);
    } finally {
      await pool.close();
    }
  });

  it("a pool closed during a hand-out that fails ends the spare and starts none after it", async () => {
    let fail: (err: Error) => void = () => {};
    const fake = Object.assign(new FakeBackend(), {
      adoptSpare: vi.fn(() => new Promise<never>((_, reject) => (fail = reject))),
    });
    const dir = join(home, "pool");
    const pool = new SandboxPool({
      size: 1,
      dir,
      appDir: "/app",
      runtimeCacheDir: "/rt",
      backend: () => fake,
    });
    pool.want(fake, "/envs/a/rootfs");
    await pool.ready();
    const [file] = readdirSync(dir).filter((n) => n.endsWith(".json"));
    const state = JSON.parse(readFileSync(join(dir, file!), "utf8")).state as SandboxState;
    const taking = pool.take(fake, wsSpec(2));
    await vi.waitFor(() => expect(fake.adoptSpare).toHaveBeenCalled());
    await pool.close();
    fail(new Error("the hand-out failed"));
    await expect(taking).rejects.toThrow("the hand-out failed");
    await pool.ready();
    expect(await fake.isRunning(state)).toBe(false);
    expect(pool.readyCount).toBe(0);
    expect(readdirSync(dir)).toEqual([]);
  });
  it("says why a hand-out was declined, and after two in a row keeps no more spares of that environment", async () => {
    const fake = Object.assign(new FakeBackend(), {
      adoptSpare: vi.fn(
        async (): Promise<SandboxState | { declined: string }> => ({ declined: "not today" }),
      ),
    });
    const warnings: string[] = [];
    const pool = new SandboxPool({
      size: 1,
      dir: join(home, "pool"),
      appDir: "/app",
      runtimeCacheDir: "/rt",
      backend: () => fake,
      warn: (m) => warnings.push(m),
    });
    try {
      pool.want(fake, "/envs/a/rootfs");
      await pool.ready();
      await expect(pool.take(fake, wsSpec(1))).resolves.toBeNull();
      await pool.ready();
      expect(pool.readyCount).toBe(1);
      await expect(pool.take(fake, wsSpec(2))).resolves.toBeNull();
      await pool.ready();
      expect(fake.adoptSpare).toHaveBeenCalledTimes(2);
      expect(warnings).toHaveLength(2);
      expect(warnings[0]).toContain("could not take workspace ws_000000000001 (not today)");
      expect(warnings[1]).toContain("the pool keeps no more spares of this environment");
      // No spare left, none started: the next create starts its own without a hand-out.
      expect(pool.readyCount).toBe(0);
      await expect(pool.take(fake, wsSpec(3))).resolves.toBeNull();
      expect(fake.adoptSpare).toHaveBeenCalledTimes(2);
    } finally {
      await pool.close();
    }
  });
});
