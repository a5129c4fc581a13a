import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, rmdir, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, describe, expect, it } from "vitest";
import { type CgroupLayout, CgroupLimits, detectCgroups } from "../../../src/backends/linux/cgroups.js";

const BASE = `pyro-test-${process.pid}`;
const isRoot = process.getuid?.() === 0;
const v1Ready =
  isRoot &&
  existsSync("/sys/fs/cgroup/memory/memory.limit_in_bytes") &&
  existsSync("/sys/fs/cgroup/pids/cgroup.procs");
const whyV1 = !isRoot
  ? "skipped: needs root"
  : !v1Ready
    ? "skipped: no writable cgroup v1 memory/pids hierarchies"
    : "";
const v2Unified = "/sys/fs/cgroup/unified";
const v2Ready = isRoot && existsSync(join(v2Unified, "cgroup.controllers"));
const whyV2 = !isRoot ? "skipped: needs root" : !v2Ready ? `skipped: no cgroup v2 tree at ${v2Unified}` : "";
const python = ["/usr/bin/python3", "/bin/python3"].find((p) => existsSync(p));

let seq = 0;
const newId = () => `t${process.pid}-${++seq}`;

interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
  stderr: string;
}

/**
 * The placement pattern the backend uses: the child waits on stdin, the test puts its
 * pid in the group, then releases it so the workload starts inside the group.
 * (spawn directly: util/run.ts cannot hold stdin open until we release the gate.)
 */
async function gated(
  cg: CgroupLimits,
  argv: string[],
): Promise<{ child: ChildProcess; exit: Promise<Exit> }> {
  const child = spawn("/bin/sh", ["-c", 'read -r _ && exec "$@"', "pyro-gate", ...argv], {
    stdio: ["pipe", "ignore", "pipe"],
  });
  let stderr = "";
  child.stderr!.on("data", (c: Buffer) => (stderr += c.toString()));
  const exit = new Promise<Exit>((resolve) =>
    child.on("close", (code, signal) => resolve({ code, signal, stderr })),
  );
  await cg.addProcess(child.pid!);
  child.stdin!.end("go\n");
  return { child, exit };
}

const cleanup: CgroupLimits[] = [];
afterAll(async () => {
  for (const cg of cleanup) await cg.destroy().catch(() => {});
  for (const c of ["memory", "cpu", "pids"]) await rmdir(`/sys/fs/cgroup/${c}/${BASE}`).catch(() => {});
  await rmdir(join(v2Unified, BASE)).catch(() => {});
});

describe("cgroup v1 on this host (real)", () => {
  it.skipIf(!v1Ready)(`detects v1 with memory, cpu and pids usable ${whyV1}`, async () => {
    const layout = await detectCgroups({ base: BASE });
    expect(layout.version).toBe(1);
    expect(layout.usable).toEqual({ memory: true, cpu: true, pids: true });
  });

  it.skipIf(!v1Ready)(`writes each limit and reads it back ${whyV1}`, async () => {
    const layout = await detectCgroups({ base: BASE });
    const id = newId();
    const cg = await CgroupLimits.create(layout, id, { vcpus: 1.5, memoryMib: 64, pidsMax: 8 });
    cleanup.push(cg);
    const read = (c: string, f: string) =>
      readFileSync(`/sys/fs/cgroup/${c}/${BASE}/${id}/${f}`, "utf8").trim();
    expect(read("memory", "memory.limit_in_bytes")).toBe(String(64 * 1024 * 1024));
    if (existsSync(`/sys/fs/cgroup/memory/${BASE}/${id}/memory.memsw.limit_in_bytes`)) {
      expect(read("memory", "memory.memsw.limit_in_bytes")).toBe(String(64 * 1024 * 1024));
    }
    expect(read("cpu", "cpu.cfs_period_us")).toBe("100000");
    expect(read("cpu", "cpu.cfs_quota_us")).toBe("150000");
    expect(read("pids", "pids.max")).toBe("8");
    await cg.destroy();
  });

  it.skipIf(!v1Ready || !python)(
    `OOM-kills a process that allocates past its memory limit ${whyV1}`,
    async () => {
      const cg = await CgroupLimits.create(await detectCgroups({ base: BASE }), newId(), { memoryMib: 64 });
      cleanup.push(cg);
      const { exit } = await gated(cg, [python!, "-c", "x = bytearray(200 * 1024 * 1024)"]);
      const r = await exit;
      expect(r.signal === "SIGKILL" || r.code === 137, JSON.stringify(r)).toBe(true);
      await cg.destroy();
    },
  );

  it.skipIf(!v1Ready)(
    `stops forks at pidsMax, reports stats, and destroy kills what is left ${whyV1}`,
    async () => {
      const layout = await detectCgroups({ base: BASE });
      const id = newId();
      const cg = await CgroupLimits.create(layout, id, { pidsMax: 8 });
      cleanup.push(cg);
      // The sleepers must not hold the test's stderr pipe open, or "close" waits for them.
      const script = "i=0; while [ $i -lt 20 ]; do sleep 60 </dev/null >/dev/null 2>&1 & i=$((i+1)); done";
      const { exit } = await gated(cg, ["/bin/sh", "-c", script]);
      const r = await exit;
      expect(r.stderr).toMatch(/fork|Resource temporarily unavailable/i);
      const stats = await cg.stats();
      expect(stats.pids).toBeGreaterThan(0);
      expect(stats.pids).toBeLessThanOrEqual(8);
      expect(stats.memory_bytes).toBeGreaterThan(0);
      const pids = readFileSync(`/sys/fs/cgroup/pids/${BASE}/${id}/cgroup.procs`, "utf8")
        .split("\n")
        .filter(Boolean)
        .map(Number);
      expect(pids.length).toBeGreaterThan(0);

      await cg.destroy();
      for (const pid of pids)
        expect(
          existsSync(`/proc/${pid}/cmdline`) && readFileSync(`/proc/${pid}/cmdline`, "utf8").length > 0,
        ).toBe(false);
      for (const c of ["memory", "pids"]) expect(existsSync(`/sys/fs/cgroup/${c}/${BASE}/${id}`)).toBe(false);
      expect(await CgroupLimits.attach(layout, id)).toBeNull();
      await cg.destroy(); // idempotent
    },
  );

  it.skipIf(!v1Ready)(`throttles a busy loop to its CPU quota ${whyV1}`, async () => {
    const layout = await detectCgroups({ base: BASE });
    const id = newId();
    const cg = await CgroupLimits.create(layout, id, { vcpus: 0.1 });
    cleanup.push(cg);
    const { exit } = await gated(cg, ["timeout", "0.5", "sh", "-c", "while :; do :; done"]);
    await exit;
    const stat = readFileSync(`/sys/fs/cgroup/cpu/${BASE}/${id}/cpu.stat`, "utf8");
    expect(Number(/nr_throttled (\d+)/.exec(stat)?.[1])).toBeGreaterThan(0);
    await cg.destroy();
  });

  it.skipIf(!v1Ready)(`finds an existing sandbox's groups again by id ${whyV1}`, async () => {
    const layout = await detectCgroups({ base: BASE });
    const id = newId();
    const cg = await CgroupLimits.create(layout, id, { memoryMib: 32 });
    cleanup.push(cg);
    const again = await CgroupLimits.attach(layout, id);
    expect(again?.dirs.get("memory")).toBe(cg.dirs.get("memory"));
    await again!.destroy();
    expect(existsSync(cg.dirs.get("memory")!)).toBe(false);
  });

  it.skipIf(!v1Ready)(
    `fails closed when the kernel rejects a limit, leaving nothing behind ${whyV1}`,
    async () => {
      const layout = await detectCgroups({ base: BASE });
      const id = newId();
      // The kernel refuses a CFS quota under 1 ms.
      await expect(CgroupLimits.create(layout, id, { memoryMib: 64, vcpus: 0.001 })).rejects.toThrow(
        /cpu\.cfs_quota_us.*EINVAL/,
      );
      for (const c of ["memory", "cpu", "pids"])
        expect(existsSync(`/sys/fs/cgroup/${c}/${BASE}/${id}`)).toBe(false);
    },
  );
});

describe("cgroup limits: checks before touching the filesystem", () => {
  const none: CgroupLayout = {
    version: null,
    root: "/nonexistent",
    base: "pyro",
    usable: { memory: false, cpu: false, pids: false },
    reasons: { memory: "no cgroup filesystem at /nonexistent" },
  };

  it("refuses a requested limit whose controller is unusable, with the reason", async () => {
    await expect(CgroupLimits.create(none, "w1", { memoryMib: 64 })).rejects.toThrow(
      /memory limit: no cgroup filesystem/,
    );
  });

  it("refuses ids that are not a plain directory name", async () => {
    for (const id of ["", "..", "a/b", ".hidden"])
      await expect(CgroupLimits.create(none, id)).rejects.toThrow(/invalid group id/);
  });

  it("reports why cgroups are unusable when there is no cgroup filesystem", async () => {
    const layout = await detectCgroups({ root: "/nonexistent-cgroup-root" });
    expect(layout.version).toBeNull();
    expect(layout.reasons.memory).toMatch(/no cgroup filesystem/);
  });
});

describe("cgroup v2 file writes (fake cgroup root)", () => {
  const roots: string[] = [];
  afterAll(async () => {
    for (const r of roots) await rm(r, { recursive: true, force: true });
  });

  async function fakeRoot(controllers: string): Promise<string> {
    const root = await mkdtemp(join(tmpdir(), "pyro-fake-cgroup-"));
    roots.push(root);
    await writeFile(join(root, "cgroup.controllers"), controllers);
    await writeFile(join(root, "cgroup.subtree_control"), "");
    return root;
  }

  it("enables controllers top-down and writes v2 limit files", async () => {
    const r = await fakeRoot("cpuset cpu io memory hugetlb pids rdma misc\n");
    const layout = await detectCgroups({ root: r });
    expect(layout.version).toBe(2);
    expect(layout.usable).toEqual({ memory: true, cpu: true, pids: true });
    // A leftover, empty group from a crashed run (with a swap file, as a kernel with swap has).
    await mkdir(join(r, "pyro", "ws1"), { recursive: true });
    await writeFile(join(r, "pyro", "ws1", "cgroup.procs"), "");
    await writeFile(join(r, "pyro", "ws1", "memory.swap.max"), "max\n");

    const cg = await CgroupLimits.create(layout, "ws1", { vcpus: 1.5, memoryMib: 64, pidsMax: 100 });
    const read = (p: string) => readFile(join(r, p), "utf8");
    expect((await read("cgroup.subtree_control")).split(" ").sort()).toEqual(["+cpu", "+memory", "+pids"]);
    expect((await read("pyro/cgroup.subtree_control")).split(" ").sort()).toEqual([
      "+cpu",
      "+memory",
      "+pids",
    ]);
    expect(await read("pyro/ws1/memory.max")).toBe(String(64 * 1024 * 1024));
    expect(await read("pyro/ws1/memory.swap.max")).toBe("0");
    expect(await read("pyro/ws1/cpu.max")).toBe("150000 100000");
    expect(await read("pyro/ws1/pids.max")).toBe("100");
    await cg.addProcess(4242);
    expect(await read("pyro/ws1/cgroup.procs")).toBe("4242");
  });

  it("does not invent memory.swap.max on a host without swap accounting", async () => {
    const r = await fakeRoot("cpu memory pids");
    await CgroupLimits.create(await detectCgroups({ root: r }), "ws2", { memoryMib: 16 });
    expect(existsSync(join(r, "pyro", "ws2", "memory.max"))).toBe(true);
    expect(existsSync(join(r, "pyro", "ws2", "memory.swap.max"))).toBe(false);
    // cpu was not requested and gives no stats: it stays off.
    expect(await readFile(join(r, "pyro", "cgroup.subtree_control"), "utf8")).toBe("+memory +pids");
  });

  it("fails closed when a requested controller is missing, creating nothing", async () => {
    const r = await fakeRoot("cpu pids");
    const layout = await detectCgroups({ root: r });
    expect(layout.reasons.memory).toMatch(/memory controller is not available/);
    await expect(CgroupLimits.create(layout, "ws3", { memoryMib: 64, pidsMax: 10 })).rejects.toThrow(
      /memory/,
    );
    expect(existsSync(join(r, "pyro"))).toBe(false);
  });

  it("refuses to take over a group that already has processes", async () => {
    const r = await fakeRoot("cpu memory pids");
    await mkdir(join(r, "pyro", "ws4"), { recursive: true });
    await writeFile(join(r, "pyro", "ws4", "cgroup.procs"), "777\n");
    await expect(
      CgroupLimits.create(await detectCgroups({ root: r }), "ws4", { pidsMax: 5 }),
    ).rejects.toThrow(/has processes/);
  });
});

describe("cgroup v2 group lifecycle on the host's unified tree (real, no controllers)", () => {
  it.skipIf(!v2Ready)(
    `places a process, then cgroup.kill ends it and the group is removed ${whyV2}`,
    async () => {
      const layout = await detectCgroups({ root: v2Unified, base: BASE });
      expect(layout.version).toBe(2);
      const id = newId();
      const cg = await CgroupLimits.create(layout, id); // no limits: this tree has no controllers
      cleanup.push(cg);
      const { child, exit } = await gated(cg, ["sleep", "60"]);
      await sleep(50);
      expect(readFileSync(`/proc/${child.pid}/cgroup`, "utf8")).toContain(`0::/${BASE}/${id}`);
      expect(existsSync(join(v2Unified, BASE, id, "cgroup.kill"))).toBe(true);
      await cg.destroy();
      const r = await exit;
      expect(r.signal).toBe("SIGKILL");
      expect(existsSync(join(v2Unified, BASE, id))).toBe(false);
    },
  );

  it.skipIf(!v2Ready)(`refuses a memory limit on a tree without the memory controller ${whyV2}`, async () => {
    const layout = await detectCgroups({ root: v2Unified, base: BASE });
    await expect(CgroupLimits.create(layout, newId(), { memoryMib: 64 })).rejects.toThrow(
      /memory controller is not available/,
    );
  });
});
