import { spawn } from "node:child_process";
import { readFile, rename, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ignoreGone } from "../../../src/backends/docker/client.js";
import {
  containersLabelled,
  dockerSkipReason,
  type TestEngine,
  useTestEngine,
} from "../../helpers/docker.js";
import { poolOwnerScript, poolProbe, spareState as spareStateOf, sparesOf } from "../../helpers/pool.js";
import { type Harness, openHarness, suiteTitle, waitUntil, writeTree } from "../../helpers/sandbox.js";

/**
 * The pool of started sandboxes on docker (core/pool.ts, backends/docker/pool.ts): an
 * unseeded create takes a container started before it, which takes the workspace's
 * identity (name, hostname, limits, directories); a seeded one starts its own. The
 * workspace must not be able to tell (a stop/start keeps its root layer although the
 * spare's container cannot start again), and nothing of a spare may be left.
 */
const skip = dockerSkipReason();
const POOL_ENV = { PYRO_POOL: "1", PYRO_BACKEND: "docker" };

const spareState = (home: string, id: string) =>
  spareStateOf<{ container_id: string; container: string }>(home, id);

/** A cgroup v1 or v2 limit file as the container sees it. */
const CG = (v1: string, v2: string) => `cat /sys/fs/cgroup/${v1} 2>/dev/null || cat /sys/fs/cgroup/${v2}`;

describe.skipIf(skip !== "")(suiteTitle("docker pool of started containers", skip), () => {
  let engine: TestEngine;
  let h: Harness;
  let seed: string;
  const { sh, createEvent, declined, watchDeclines, ...probe } = poolProbe(() => h);
  const recorded = (id: string) => probe.recorded<{ container_id: string; container: string }>(id);
  const volumesNamed = async (part: string) =>
    ((await engine.docker.listVolumes()).Volumes ?? []).map((v) => v.Name).filter((n) => n.includes(part));
  const rootImages = async () =>
    (await engine.docker.listImages({ filters: { reference: ["pyro-root"] } })).flatMap(
      (i) => i.RepoTags ?? [],
    );

  beforeAll(async () => {
    engine = await useTestEngine();
    h = await openHarness("docker-pool", { backend: "docker" }, { env: { ...engine.env, ...POOL_ENV } });
    watchDeclines();
    seed = join(await h.tempDir("docker-pool-seed"), "seed");
    await writeTree(seed, { "hello.txt": "hello\n" });
    await h.pyro.engine.warmPool();
    await h.pyro.engine.pool.ready();
  }, 120_000);
  afterAll(async () => {
    await h?.cleanup();
    await engine?.release();
  });

  it("hands a started container to an unseeded create, which becomes the workspace's, and keeps its root layer over a stop", {
    timeout: 120_000,
  }, async () => {
    const [spare] = await sparesOf(h.home);
    expect(spare).toMatch(/^spare_/);
    const before = await spareState(h.home, spare!);
    const id = (await h.create()).workspace_id;
    const host = `pyro-${id.slice(3, 15)}`;
    expect(createEvent(id)?.sandbox, declined.join("; ")).toBe("pool");
    expect(recorded(id)).toMatchObject({ container_id: before.container_id, container: `pyro-${id}` });
    const c = await engine.docker.getContainer(before.container_id).inspect();
    expect(c.Name).toBe(`/pyro-${id}`);
    expect(c.HostConfig).toMatchObject({ Memory: 1024 * 1024 * 1024, PidsLimit: 1024, NanoCpus: 1e9 });
    // Its identity inside: hostname (the kernel's and /etc/hostname), limits, directories.
    expect(await sh(id, "hostname; cat /etc/hostname")).toBe(`${host}\n${host}`);
    expect(await sh(id, CG("memory/memory.limit_in_bytes", "memory.max"))).toBe(String(1024 * 1024 * 1024));
    expect(await sh(id, CG("pids/pids.max", "pids.max"))).toBe("1024");
    expect(await sh(id, "ls -A /workspace; pwd; ls -A /run/pyro/snapshots")).toBe("/workspace\nbaseline");
    // The disk limit came with it: /workspace on the spare's image, moved with its directory.
    expect((await h.pyro.getWorkspace(id)).limits.disk_mib).toBe(10 * 1024);
    expect(Number(await sh(id, "df -k --output=size /workspace | tail -1"))).toBeLessThanOrEqual(
      10 * 1024 * 1024,
    );
    // Nothing of the spare: its name in no variable, file of /tmp or process.
    expect(await sh(id, "env | grep -ci spare || true")).toBe("0");
    // Nor in the agent's (the container's first process's) environment.
    expect(await sh(id, "tr '\\0' '\\n' </proc/1/environ | grep -ci spare || true")).toBe("0");
    expect(await sh(id, "ls -A /tmp | wc -l")).toBe("0");
    expect(await sh(id, "cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -ci 'spar[e]' || true")).toBe("0");
    expect(await sparesOf(h.home)).not.toContain(spare);
    // Snapshots, diff and a reset onto one work as in a container it started.
    await sh(id, "echo one > one.txt");
    await h.pyro.createSnapshot(id, "first");
    await sh(id, "echo two > two.txt && echo root-layer > /root/kept");
    expect((await h.pyro.diffWorkspace(id, { snapshot: "first" })).entries.map((f) => f.path)).toEqual([
      "two.txt",
    ]);
    // A stop and start: the spare's container cannot start again (its binds name the
    // spare's paths), so it is replaced by the workspace's own, on its committed root layer.
    await h.pyro.stopWorkspace(id);
    await h.pyro.startWorkspace(id);
    expect(recorded(id).container_id).not.toBe(before.container_id);
    expect(await sh(id, "cat one.txt two.txt /root/kept; hostname")).toBe(`one\ntwo\nroot-layer\n${host}`);
    expect(Number(await sh(id, "df -k --output=size /workspace | tail -1"))).toBeLessThanOrEqual(
      10 * 1024 * 1024,
    );
    expect(await containersLabelled(engine.docker, "dev.pyro.workspace", spare!)).toEqual([]);
    expect(await volumesNamed(spare!)).toEqual([]);
    expect(await rootImages()).toContain(`pyro-root:${id}`);
    // From then on a stop and start keeps the workspace's own container, as for any.
    const own = recorded(id).container_id;
    await h.pyro.stopWorkspace(id);
    await h.pyro.startWorkspace(id);
    expect(recorded(id).container_id).toBe(own);
    expect(await sh(id, "cat /root/kept")).toBe("root-layer");
    await h.pyro.resetWorkspace(id, { snapshot: "first" });
    expect(await sh(id, "ls | tr '\\n' ' '; cat /root/kept 2>/dev/null || echo no-root")).toBe(
      "one.txt no-root",
    );
    await h.pyro.deleteWorkspace(id);
    expect(await containersLabelled(engine.docker, "dev.pyro.workspace", id)).toEqual([]);
    expect(await volumesNamed(id)).toEqual([]);
    expect(await rootImages()).not.toContain(`pyro-root:${id}`);
  });

  it("takes other limits by the engine's update; a seeded create starts its own", {
    timeout: 120_000,
  }, async () => {
    await h.pyro.engine.pool.ready();
    const big = (await h.create({ memoryMib: 768, vcpus: 2 })).workspace_id;
    expect(createEvent(big)?.sandbox, declined.join("; ")).toBe("pool");
    expect(await sh(big, CG("memory/memory.limit_in_bytes", "memory.max"))).toBe(String(768 * 1024 * 1024));
    expect(await sh(big, CG("cpu/cpu.cfs_quota_us", "cpu.max"))).toMatch(/^(200000|200000 100000)$/);
    const c = await engine.docker.getContainer(recorded(big).container_id).inspect();
    expect(c.HostConfig).toMatchObject({
      Memory: 768 * 1024 * 1024,
      MemorySwap: 768 * 1024 * 1024,
      NanoCpus: 2e9,
    });
    // A disk read of the stopped workspace replaces the spare's container too (its volume
    // names the spare's paths), then a start keeps its root layer and its limits.
    await sh(big, "echo disk > disk.txt && echo root-layer > /root/kept");
    await h.pyro.stopWorkspace(big);
    expect((await h.pyro.readWorkspaceDisk(big, "disk.txt")).content).toBe("disk\n");
    await h.pyro.startWorkspace(big);
    expect(await sh(big, `cat /root/kept; ${CG("memory/memory.limit_in_bytes", "memory.max")}`)).toBe(
      `root-layer\n${768 * 1024 * 1024}`,
    );
    await h.pyro.engine.pool.ready();
    const seeded = (await h.create({ seedPath: seed })).workspace_id;
    expect(createEvent(seeded)?.sandbox).toBe("started");
    expect(declined.at(-1)).toMatch(/seed/);
    expect(await sh(seeded, "cat hello.txt; hostname")).toBe(`hello\npyro-${seeded.slice(3, 15)}`);
    // Two workspaces from spares share nothing.
    await h.pyro.engine.pool.ready();
    const other = (await h.create()).workspace_id;
    expect(createEvent(other)?.sandbox, declined.join("; ")).toBe("pool");
    await sh(big, "echo mine > a-only.txt && echo x > /tmp/a-tmp");
    expect(await sh(other, "ls /workspace /tmp | grep -c a- || true")).toBe("0");
  });

  it("a spare whose container died is not handed out: the create starts its own and the spare is gone", {
    timeout: 120_000,
  }, async () => {
    await h.pyro.engine.pool.ready();
    const [spare] = await sparesOf(h.home);
    const { container_id } = await spareState(h.home, spare!);
    await engine.docker.getContainer(container_id).kill();
    await engine.docker.getContainer(container_id).wait({ condition: "not-running" });
    const id = (await h.create()).workspace_id;
    expect(createEvent(id)?.sandbox).toBe("started");
    expect(declined.at(-1)).toMatch(/gone/);
    expect(await sh(id, "hostname")).toBe(`pyro-${id.slice(3, 15)}`);
    expect(await sparesOf(h.home)).not.toContain(spare);
    expect(await containersLabelled(engine.docker, "dev.pyro.workspace", spare!)).toEqual([]);
    expect(await volumesNamed(spare!)).toEqual([]);
  });

  it("a spare whose owner was killed, even mid hand-out, is removed by the next pool: container and volume", {
    timeout: 120_000,
  }, async () => {
    const script = poolOwnerScript();
    const home = await h.tempDir("docker-pool-owner");
    const env = {
      ...process.env,
      ...engine.env,
      ...POOL_ENV,
      PYRO_HOME: home,
      PYRO_ENV_CACHE: h.cliEnv.PYRO_ENV_CACHE,
    };
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], { env, stdio: "pipe" });
    let out = "";
    child.stdout.on("data", (d: Buffer) => {
      out += d.toString();
    });
    child.stderr.on("data", (d: Buffer) => {
      out += d.toString();
    });
    await waitUntil(() => out.includes("ready"), 90_000);
    expect(out).toContain("ready 1");
    const [spare] = await sparesOf(home);
    const { container_id } = await spareState(home, spare!);
    expect((await engine.docker.getContainer(container_id).inspect()).State.Running).toBe(true);
    child.kill("SIGKILL");
    await new Promise((r) => child.once("exit", r));
    // As if the owner died in a hand-out after the container was renamed (backends/docker/
    // pool.ts: the spare's record names it first): the reaper must still find it by id.
    const sandbox = join(home, "pool", spare!, "sandbox");
    const record = JSON.parse(await readFile(join(sandbox, "docker.json"), "utf8"));
    const adopted = { container_id, volume: `pyro-${spare}-workspace`, label_dir: sandbox };
    await writeFile(join(sandbox, "docker.json"), JSON.stringify({ ...record, adopted }));
    await engine.docker.getContainer(container_id).rename({ name: "pyro-ws_handedout00" });
    await rename(join(home, "pool", `${spare}.json`), join(home, "pool", `${spare}.taken.json`));
    const { Pyro } = await import("../../../src/sdk/pyro.js");
    const next = new Pyro({ home, environmentsDir: String(h.cliEnv.PYRO_ENV_CACHE), env });
    try {
      await next.engine.warmPool();
      await next.engine.pool.ready();
      expect(await ignoreGone(engine.docker.getContainer(container_id).inspect())).toBeUndefined();
      expect(await containersLabelled(engine.docker, "dev.pyro.workspace", spare!)).toEqual([]);
      expect(await volumesNamed(spare!)).toEqual([]);
      expect(await sparesOf(home)).not.toContain(spare);
    } finally {
      await next.close();
    }
    expect(await sparesOf(home)).toEqual([]);
  });
});
