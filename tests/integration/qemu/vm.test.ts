import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, readdir, symlink, writeFile } from "node:fs/promises";
import { release } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AGENT_ENTRY, sandboxHostname } from "../../../src/backends/guest.js";
import type { QemuBackend } from "../../../src/backends/qemu/backend.js";
import { pyro, REPO_ROOT } from "../../helpers/cli.js";
import {
  allocatedBytes,
  errorOf,
  type Harness,
  hostProcesses,
  openHarness,
  processAlive,
  qemuSkipReason,
  suiteTitle,
  waitUntil,
} from "../../helpers/sandbox.js";

/**
 * The qemu backend on this machine (TCG: KVM does not run guests here). Every fresh
 * workspace is restored from one template VM, built on first use and cached beside the
 * environments; restarts of a workspace whose disk holds writes cold-boot.
 */
const skip = qemuSkipReason();
const SLOW = { timeout: 300_000 };

function qemuProcessesOf(id: string) {
  return hostProcesses(
    (argv) => argv[0]?.endsWith("qemu-system-x86_64") === true && argv.some((a) => a.includes(id)),
  );
}

describe.skipIf(skip !== "")(suiteTitle("qemu backend (microVM)", skip), () => {
  let h: Harness;
  beforeAll(async () => {
    h = await openHarness("qemu", { backend: "qemu" });
  }, 600_000);
  afterAll(async () => {
    await h?.cleanup();
  }, 120_000);

  it(
    "`pyro run debian:12 --backend qemu -- uname -r` prints the guest's kernel, not the host's",
    SLOW,
    async () => {
      const r = pyro(["run", "debian:12", "--backend", "qemu", "--", "uname", "-r"], h.cliEnv, 280_000);
      expect(r.stderr).toBe("");
      expect(r.code).toBe(0);
      expect(r.stdout.trim()).toMatch(/^\d+\.\d+\.\d+-\d+-cloud-amd64$/);
      expect(r.stdout.trim()).not.toBe(release());
    },
  );

  it(
    "a workspace is a VM: own kernel, the seed under /workspace, no network but lo, limits from the spec",
    SLOW,
    async () => {
      const seed = await h.tempDir("qemu-seed");
      execFileSync("sh", ["-c", `mkdir -p "${seed}/src" && echo hello > "${seed}/src/a.txt"`]);
      const w = await h.create({ seedPath: seed, memoryMib: 1024, vcpus: 1 });
      expect(w).toMatchObject({ backend: "qemu", execution_mode: "guest_agent", state: "running" });
      const r = await h.pyro.execWorkspace(
        w.workspace_id,
        "uname -r; cat src/a.txt; pwd; ls /sys/class/net; nproc; awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo",
      );
      const [kernel, content, cwd, net, cpus, memMib] = r.stdout.trim().split("\n");
      expect(kernel).not.toBe(release());
      expect(content).toBe("hello");
      expect(cwd).toBe("/workspace");
      expect(net).toBe("lo");
      expect(cpus).toBe("1");
      expect(Number(memMib)).toBeGreaterThan(700);
      expect(Number(memMib)).toBeLessThanOrEqual(1024);
      // The host's files are not there: the guest's root is the environment disk.
      expect((await h.pyro.execWorkspace(w.workspace_id, `test -e ${h.home}; echo $?`)).stdout).toBe("1\n");
      // Mounted by the setup helper (vm/setup-helper.ts): the usual modes, its socket root's only.
      expect(
        (await h.pyro.execWorkspace(w.workspace_id, "stat -c %a /workspace /run/pyro/setup.sock")).stdout,
      ).toBe("755\n700\n");
    },
  );

  it(
    "writes to /workspace and to the root survive stop/start (a cold boot on the kept disk)",
    SLOW,
    async () => {
      const w = await h.create();
      await h.pyro.execWorkspace(
        w.workspace_id,
        "echo kept > /workspace/k.txt && echo rootfs > /etc/pyro-test",
      );
      expect((await h.pyro.stopWorkspace(w.workspace_id)).state).toBe("stopped");
      expect(qemuProcessesOf(w.workspace_id)).toEqual([]);
      expect((await errorOf(h.pyro.execWorkspace(w.workspace_id, "true"))).code).toBe("workspace_stopped");
      await h.pyro.startWorkspace(w.workspace_id);
      expect((await h.pyro.execWorkspace(w.workspace_id, "cat /workspace/k.txt /etc/pyro-test")).stdout).toBe(
        "kept\nrootfs\n",
      );
    },
  );

  it(
    "a disk limit sizes the VM's state filesystem: ENOSPC inside, the host's space kept, the workspace usable",
    SLOW,
    async () => {
      // 128 MiB: a template of its own (the saved state has its filesystem mounted).
      const w = (await h.create({ diskMib: 128 })).workspace_id;
      expect((await h.pyro.getWorkspace(w)).limits).toMatchObject({ disk_mib: 128 });
      // The workspace's own files on the host (its qcow2 state disk grows with what the
      // guest writes); the file system's free space moves with every other test too.
      const used = () => allocatedBytes(join(h.home, "workspaces", w));
      const before = await used();
      const r = await h.pyro.execWorkspace(
        w,
        "dd if=/dev/zero of=/workspace/big bs=1M count=300; echo dd=$?",
        {
          timeoutSeconds: 240,
        },
      );
      expect(r.stderr).toMatch(/No space left on device/);
      expect(r.stdout).toContain("dd=1");
      expect((await used()) - before).toBeLessThan(160 * 1024 * 1024);
      const after = await h.pyro.execWorkspace(
        w,
        "rm /workspace/big && echo fine > /workspace/ok.txt && cat /workspace/ok.txt",
      );
      expect(after.stdout).toBe("fine\n");
      await h.pyro.deleteWorkspace(w);
    },
  );

  it(
    "a killed QEMU fails the request in flight with a clear error, and the next request restarts the VM with its files",
    SLOW,
    async () => {
      const w = await h.create();
      await h.pyro.execWorkspace(w.workspace_id, "echo before > /workspace/b.txt && sync");
      const [vm] = qemuProcessesOf(w.workspace_id);
      expect(vm).toBeDefined();
      const started = Date.now();
      const inFlight = errorOf(h.pyro.execWorkspace(w.workspace_id, "sleep 60"));
      await new Promise((r) => setTimeout(r, 2000));
      process.kill(vm!.pid, "SIGKILL");
      const err = await inFlight;
      expect(err.code).toBe("backend_unavailable");
      expect(err.message).toMatch(/died during the request/);
      expect(Date.now() - started).toBeLessThan(30_000);
      await waitUntil(() => !processAlive(vm!.pid), 10_000);
      expect((await h.pyro.execWorkspace(w.workspace_id, "cat /workspace/b.txt")).stdout).toBe("before\n");
    },
  );

  it(
    "a guest whose agent cannot start fails the start within seconds, in the console's words",
    SLOW,
    async () => {
      // A copy of the package whose agent exits at once: stage 2 restarts it every second.
      // The wait for the agent is 300 s on a cold boot; the boot watcher ends it early.
      const app = await h.tempDir("broken-app");
      execFileSync("cp", ["-r", join(REPO_ROOT, "dist"), app]);
      await symlink(join(REPO_ROOT, "node_modules"), join(app, "node_modules"));
      await writeFile(join(app, AGENT_ENTRY), "process.exit(3);\n");
      const env = await h.pyro.engine.environments.pull("debian:12");
      const dir = await h.tempDir("broken-vm");
      await mkdir(join(dir, "snapshots", "baseline"), { recursive: true });
      const { QemuBackend } = await import("../../../src/backends/qemu/backend.js");
      const id = "ws_b0b0b0b0b0b0";
      const started = Date.now();
      const err = await errorOf(
        new QemuBackend({ coldBoot: true }).start({
          workspace_id: id,
          dir: join(dir, "sandbox"),
          rootfs: env.rootfs,
          snapshotsDir: join(dir, "snapshots"),
          snapshot: "baseline",
          limits: { vcpus: 1, memory_mib: 512, pids_max: 1024 },
          appDir: app,
          runtimeCacheDir: join(h.home, "runtime"),
        }),
      );
      expect(err.code).toBe("backend_unavailable");
      expect(err.message).toMatch(/the guest agent exited \d+ times during the boot/);
      expect(err.message).toMatch(/pyro-init: \S+ exited 3, restarting/);
      expect(Date.now() - started).toBeLessThan(150_000);
      expect(qemuProcessesOf(id)).toEqual([]);
    },
  );

  it("a guest kernel panic ends the VM (never a spinning, hung one) and is reported", SLOW, async () => {
    const w = await h.create();
    const [vm] = qemuProcessesOf(w.workspace_id);
    expect(vm).toBeDefined();
    const err = await errorOf(h.pyro.execWorkspace(w.workspace_id, "echo c > /proc/sysrq-trigger; sleep 30"));
    expect(err.code).toBe("backend_unavailable");
    await waitUntil(() => !processAlive(vm!.pid), 30_000);
    // The next request cold-boots it again.
    expect((await h.pyro.execWorkspace(w.workspace_id, "echo back")).stdout).toBe("back\n");
  });

  it(
    "diff sees a snapshot created while the VM runs; reset restores it from its seed disk",
    SLOW,
    async () => {
      const w = await h.create();
      await h.pyro.execWorkspace(w.workspace_id, "echo one > f.txt");
      await h.pyro.createSnapshot(w.workspace_id, "s1");
      await h.pyro.execWorkspace(w.workspace_id, "echo two > f.txt && echo new > g.txt");
      const d = await h.pyro.diffWorkspace(w.workspace_id, { snapshot: "s1" });
      expect(d.entries).toEqual([
        { path: "f.txt", status: "modified" },
        { path: "g.txt", status: "added" },
      ]);
      await h.pyro.resetWorkspace(w.workspace_id, { snapshot: "s1" });
      expect((await h.pyro.execWorkspace(w.workspace_id, "cat f.txt; test -e g.txt; echo $?")).stdout).toBe(
        "one\n1\n",
      );
      // Against the baseline now: the current snapshot is s1, the baseline is pushed on demand.
      expect((await h.pyro.diffWorkspace(w.workspace_id)).entries).toEqual([
        { path: "f.txt", status: "added" },
      ]);
    },
  );

  it(
    "reset: a new VM from the template, set up through the helper's port (files, processes gone; hostname, clock, RNG, limits, no network; usable)",
    SLOW,
    async () => {
      const backend = (await h.pyro.engine.loadBackend("qemu")) as QemuBackend;
      const seed = await h.tempDir("qemu-reset-seed");
      execFileSync("sh", ["-c", `echo seeded > "${seed}/s.txt"`]);
      const id = (await h.create({ seedPath: seed, memoryMib: 1024, vcpus: 1 })).workspace_id;
      await h.pyro.execWorkspace(
        id,
        "echo junk > junk.txt; rm s.txt; echo x > /etc/pyro-reset; hostname changed; setsid -f sleep 1000 >/dev/null 2>&1",
      );
      // setsid: a plain `&` job ends with its exec; this one outlives it until the reset.
      expect((await h.pyro.execWorkspace(id, "grep -lx sleep /proc/[0-9]*/comm | wc -l")).stdout).toBe("1\n");
      const [before] = qemuProcessesOf(id);
      const random = "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'";
      const probe = [
        random,
        "echo",
        "ls -A /workspace | grep -vx lost+found | tr '\\n' ' '",
        "echo",
        "cat /workspace/s.txt",
        "test -e /etc/pyro-reset; echo rootfs=$?",
        "grep -lx sleep /proc/[0-9]*/comm 2>/dev/null | wc -l",
        "hostname",
        "date +%s",
        "nproc",
        "awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo",
        "ls /sys/class/net",
        "echo fine > new.txt && cat new.txt",
      ].join("; ");
      const outputs: string[][] = [];
      for (let i = 0; i < 2; i++) {
        await h.pyro.resetWorkspace(id);
        // Set up by the helper's own port, beside the agent's handshake (qemu/setup-port.ts).
        expect(backend.lastStart).toMatchObject({ mode: "restore", setup_via: "port" });
        outputs.push((await h.pyro.execWorkspace(id, probe)).stdout.trim().split("\n"));
        await h.pyro.execWorkspace(id, "rm new.txt");
      }
      expect(processAlive(before!.pid)).toBe(false);
      for (const [, files, content, rootfs, sleeps, hostname, date, cpus, memMib, net, usable] of outputs) {
        expect(files?.trim()).toBe("s.txt");
        expect(content).toBe("seeded");
        expect(rootfs).toBe("rootfs=1");
        expect(sleeps).toBe("0");
        expect(hostname).toBe(sandboxHostname(id));
        expect(Math.abs(Number(date) - Date.now() / 1000)).toBeLessThan(30);
        expect(cpus).toBe("1");
        expect(Number(memMib)).toBeLessThanOrEqual(1024);
        expect(net).toBe("lo");
        expect(usable).toBe("fine");
      }
      // Each reset's CRNG was reseeded with the host's entropy: not the template's stream.
      expect(outputs[0]![0]).toMatch(/^[0-9a-f]{32}$/);
      expect(outputs[0]![0]).not.toBe(outputs[1]![0]);
    },
  );

  it(
    "the guest's clock and RNG are not the template's: clones differ and follow the host",
    SLOW,
    async () => {
      const a = await h.create();
      const b = await h.create();
      const probe = "date +%s; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'";
      const [ta, ra] = (await h.pyro.execWorkspace(a.workspace_id, probe)).stdout.trim().split("\n");
      const [tb, rb] = (await h.pyro.execWorkspace(b.workspace_id, probe)).stdout.trim().split("\n");
      expect(Math.abs(Number(ta) - Date.now() / 1000)).toBeLessThan(30);
      expect(Math.abs(Number(tb) - Date.now() / 1000)).toBeLessThan(30);
      expect(ra).not.toBe(rb);
    },
  );

  it("delete leaves no QEMU process, socket, disk or directory behind", SLOW, async () => {
    const w = await h.create();
    const dir = join(h.home, "workspaces", w.workspace_id);
    expect(qemuProcessesOf(w.workspace_id)).toHaveLength(1);
    expect(existsSync(join(dir, "sandbox", "state.qcow2"))).toBe(true);
    await h.pyro.deleteWorkspace(w.workspace_id);
    expect(qemuProcessesOf(w.workspace_id)).toEqual([]);
    expect(existsSync(dir)).toBe(false);
    expect((await readdir(join(h.home, "workspaces"))).filter((d) => d === w.workspace_id)).toEqual([]);
  });

  it(
    "`pyro doctor` explains qemu's accelerator and why KVM and Firecracker are or are not used",
    SLOW,
    async () => {
      const r = pyro(["doctor", "--json"], h.cliEnv, 60_000);
      const report = JSON.parse(r.stdout) as {
        kvm: { usable: boolean; reason: string | null };
        backends: {
          name: string;
          available: boolean;
          reason: string | null;
          opt_in: boolean;
          details: Record<string, unknown>;
        }[];
      };
      const qemu = report.backends.find((b) => b.name === "qemu")!;
      const fc = report.backends.find((b) => b.name === "firecracker")!;
      expect(qemu.available).toBe(true);
      expect(qemu.details.accel).toBe(report.kvm.usable ? "kvm" : "tcg");
      if (!report.kvm.usable) {
        expect(qemu.opt_in).toBe(true);
        expect(qemu.reason).toMatch(/KVM not usable/);
        expect(fc.available).toBe(false);
        expect(fc.reason).toMatch(/KVM not usable|firecracker binary/);
      }
    },
  );

  it(
    "the template serves every fresh workspace: a restore is much faster than the cold boot it replaces",
    SLOW,
    async () => {
      const backend = (await h.pyro.engine.loadBackend("qemu")) as QemuBackend;
      const w = await h.create();
      expect(backend.lastStart).toMatchObject({ mode: "restore", setup_via: "port" });
      await h.pyro.stopWorkspace(w.workspace_id);
      await h.pyro.startWorkspace(w.workspace_id);
      // A cold boot is set up by the agent's vm_setup, once it answers (setup-port.ts).
      expect(backend.lastStart).toMatchObject({ mode: "cold", setup_via: "agent" });
      expect((await h.pyro.execWorkspace(w.workspace_id, "hostname")).stdout).toBe(
        `${sandboxHostname(w.workspace_id)}\n`,
      );
    },
  );
});
