import { type ChildProcess, spawn } from "node:child_process";
import {
  appendFile,
  mkdir,
  mkdtemp,
  readdir,
  readFile,
  realpath,
  rm,
  stat,
  writeFile,
} from "node:fs/promises";
import { createServer as createHttpServer, type Server as HttpServer } from "node:http";
import {
  createConnection,
  createServer as createNetServer,
  type Server as NetServer,
  type Socket,
} from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { AgentClient } from "../../../src/agent/client.js";
import { BUILTIN_OPS } from "../../../src/agent/guest/ops/index.js";
import { Workspace } from "../../../src/agent/guest/paths.js";
import { PROTOCOL_VERSION } from "../../../src/agent/messages.js";
import { NetMux } from "../../../src/agent/netmux.js";
import { serveConnection } from "../../../src/agent/server.js";
import type { SandboxSpec, SandboxState } from "../../../src/backends/backend.js";
import { procStartTime, sameProcessAlive } from "../../../src/backends/common.js";
import { DEFAULT_DISK_MIB } from "../../../src/backends/disk-image.js";
import { FirecrackerBackend, type FirecrackerOptions } from "../../../src/backends/firecracker/backend.js";
import { bootArgs, disksArg, driveConfigs, driveId } from "../../../src/backends/firecracker/vm.js";
import type { VmArtifacts } from "../../../src/backends/vm/types.js";

interface Req {
  method: string;
  path: string;
  body: unknown;
}

/** One faked Firecracker process: its API server, its "guest" (vsock socket + a real agent). */
interface FakeVm {
  argv: readonly string[];
  cwd: string;
  pid: number;
  requests: Req[];
  /** Drive files as Firecracker would open them: path_on_host resolved against its cwd. */
  opened: Record<string, string>;
  api: HttpServer;
  guest: NetServer | null;
  sockets: Socket[];
}

/**
 * A fake `firecracker`: the spawner starts a real (sleeping) process for the pid, and an
 * in-process API server on --api-sock that records every request and answers like
 * Firecracker (204, or 400 with a fault_message). InstanceStart or a resume "boots" the
 * guest: a listener on the vsock socket that speaks Firecracker's CONNECT handshake and
 * then serves a real agent session. Snapshots are JSON files recording the configured
 * drive and vsock paths exactly as given; a load resolves them against the loading
 * process's working directory, as Firecracker does.
 */
class FakeFirecracker {
  readonly vms: FakeVm[] = [];
  readonly faults = new Map<string, string>();
  dieOnStart = false;
  private readonly children: ChildProcess[] = [];

  constructor(private readonly agentRoot: string) {}

  spawn: NonNullable<FirecrackerOptions["spawn"]> = async (argv, options) => {
    // Relative to its working directory, like every path Firecracker is given.
    const apiSocket = resolve(options.cwd, argv[argv.indexOf("--api-sock") + 1]!);
    const child = spawn("sleep", ["600"], { stdio: "ignore" });
    this.children.push(child);
    const pid = child.pid!;
    const startTime = (await procStartTime(pid))!;
    const vm: FakeVm = {
      argv,
      cwd: options.cwd,
      pid,
      requests: [],
      opened: {},
      api: createHttpServer(),
      guest: null,
      sockets: [],
    };
    const config: { drives: Record<string, { path_on_host: string }>; vsock: string | null } = {
      drives: {},
      vsock: null,
    };
    vm.api.on("request", (req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        void (async () => {
          const body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
          const key = `${req.method} ${req.url}`;
          vm.requests.push({ method: req.method!, path: req.url!, body });
          const fail = (msg: string) => {
            res.writeHead(400, { "Content-Type": "application/json" });
            res.end(JSON.stringify({ fault_message: msg }));
          };
          const fault = this.faults.get(key);
          if (fault) return fail(fault);
          if (key === "GET /") {
            res.writeHead(200, { "Content-Type": "application/json" });
            res.end(
              JSON.stringify({
                id: "anonymous-instance",
                state: "Not started",
                vmm_version: "1.x",
                app_name: "Firecracker",
              }),
            );
            return;
          }
          try {
            if (req.method === "PUT" && req.url?.startsWith("/drives/")) {
              config.drives[body.drive_id] = body;
              vm.opened[body.drive_id] = await realpath(resolve(vm.cwd, body.path_on_host));
            } else if (key === "PUT /vsock") config.vsock = body.uds_path;
            else if (key === "PUT /actions") {
              if (this.dieOnStart) {
                await appendFile(options.logFile, "kvm: KVM_CREATE_VM failed: boom\n");
                process.kill(pid, "SIGKILL");
              } else await this.boot(vm, config.vsock!);
            } else if (key === "PUT /snapshot/create") {
              await writeFile(body.snapshot_path, JSON.stringify(config));
              await writeFile(body.mem_file_path, "guest memory");
            } else if (key === "PUT /snapshot/load") {
              const snap = JSON.parse(await readFile(body.snapshot_path, "utf8"));
              await readFile(body.mem_backend.backend_path);
              for (const [id, d] of Object.entries(snap.drives as Record<string, { path_on_host: string }>))
                vm.opened[id] = await realpath(resolve(vm.cwd, d.path_on_host));
              config.drives = snap.drives;
              config.vsock = snap.vsock;
              if (body.resume_vm) await this.boot(vm, config.vsock!);
            } else if (req.method === "PATCH" && req.url?.startsWith("/drives/")) {
              if (!config.drives[body.drive_id]) return fail(`no drive ${body.drive_id}`);
              vm.opened[body.drive_id] = await realpath(resolve(vm.cwd, body.path_on_host));
            } else if (key === "PATCH /vm" && body.state === "Resumed" && !vm.guest)
              await this.boot(vm, config.vsock!);
          } catch (err) {
            return fail((err as Error).message);
          }
          res.writeHead(204);
          res.end();
        })();
      });
    });
    await new Promise<void>((r) => vm.api.listen(apiSocket, r));
    this.vms.push(vm);
    return { pid, startTime };
  };

  private async boot(vm: FakeVm, uds: string): Promise<void> {
    const workspace = await Workspace.open(this.agentRoot);
    vm.guest = createNetServer((sock) => {
      vm.sockets.push(sock);
      sock.on("error", () => {});
      sock.once("data", (chunk) => {
        const line = chunk.toString();
        if (line === "CONNECT 1025\n") {
          // The guest's network mux (agent/netmux.ts): published ports dial the host's
          // loopback here, standing in for the guest's.
          sock.write("OK 1073741825\n");
          new NetMux(sock, "guest", async (req) => {
            if (req.kind !== "port") throw new Error("ports only");
            return createConnection({ host: "127.0.0.1", port: req.port });
          });
          return;
        }
        if (line !== "CONNECT 1024\n") {
          sock.destroy();
          return;
        }
        sock.write("OK 1073741824\n");
        void serveConnection(sock, { workspace, handlers: BUILTIN_OPS, tmpDir: this.agentRoot });
      });
    });
    await new Promise<void>((r) => vm.guest!.listen(resolve(vm.cwd, uds), r));
  }

  async close(): Promise<void> {
    for (const c of this.children) c.kill("SIGKILL");
    for (const vm of this.vms) {
      for (const s of vm.sockets) s.destroy();
      vm.api.closeAllConnections();
      await new Promise((r) => vm.api.close(r));
      if (vm.guest) await new Promise((r) => vm.guest!.close(r));
    }
  }
}

const calls = (vm: FakeVm) => vm.requests.map((r) => `${r.method} ${r.path}`);

let base: string;
let fake: FakeFirecracker;
let artifacts: VmArtifacts;
let setupCalls: { hostname: string | undefined }[];
let syncCalls: number;
let blankCalls: { path: string; sizeMib: number }[];
let bridgeOption: unknown;

function spec(id: string, limits = { vcpus: 2, memory_mib: 512, pids_max: 256 }): SandboxSpec {
  return {
    workspace_id: id,
    dir: join(base, "workspaces", id),
    rootfs: join(base, "env", "rootfs"),
    snapshotsDir: join(base, "workspaces", id, "snapshots"),
    snapshot: "initial",
    limits,
    appDir: base,
    runtimeCacheDir: join(base, "runtime"),
  };
}

function backend(options: FirecrackerOptions = {}): FirecrackerBackend {
  return new FirecrackerBackend({
    bin: join(base, "bin", "firecracker"),
    templatesDir: join(base, "templates"),
    spawn: fake.spawn,
    prepareVmArtifacts: async (_spec, opts) => {
      bridgeOption = opts.vsockBridge;
      return artifacts;
    },
    seedImage: async (s, name) => {
      const dir = join(s.dir, "seeds");
      await mkdir(dir, { recursive: true });
      const path = join(dir, `${name}.ext4`);
      await writeFile(path, `seed of ${s.workspace_id}`);
      return path;
    },
    blankExt4: async (path, sizeMib) => {
      blankCalls.push({ path, sizeMib });
      await writeFile(path, "blank ext4");
    },
    setupGuest: async (connect, options) => {
      const client = await AgentClient.connect(await connect(), { timeoutMs: options.timeoutMs });
      await client.request("ping", {});
      client.close();
      setupCalls.push({ hostname: options.hostname });
    },
    syncGuest: async (connect) => {
      (await connect()).destroy();
      syncCalls++;
    },
    bootTimeoutMs: 5000,
    restoreTimeoutMs: 5000,
    ...options,
  });
}

beforeEach(async () => {
  base = await realpath(await mkdtemp(join(tmpdir(), "pyro-fc-backend-")));
  await mkdir(join(base, "bin"));
  await writeFile(join(base, "bin", "firecracker"), "#!/bin/sh\n", { mode: 0o755 });
  const img = join(base, "vm-cache");
  await mkdir(img);
  for (const f of ["vmlinux", "initrd.cpio", "env.ext4", "agent.ext4"]) await writeFile(join(img, f), f);
  artifacts = {
    image: {
      key: "img1",
      kernelRelease: "6.1.0-test",
      kernel: join(img, "vmlinuz"),
      vmlinux: join(img, "vmlinux"),
      initrd: join(img, "initrd.cpio"),
    },
    envDisk: join(img, "env.ext4"),
    agentDisk: join(img, "agent.ext4"),
    cmdline: ["console=ttyS0", "quiet"],
  };
  await mkdir(join(base, "agent-root"));
  fake = new FakeFirecracker(join(base, "agent-root"));
  setupCalls = [];
  syncCalls = 0;
  blankCalls = [];
  bridgeOption = undefined;
});

afterEach(async () => {
  await fake.close();
  await rm(base, { recursive: true, force: true });
});

const BOOT_ARGS =
  "console=ttyS0 quiet pyro.channel=vsock pyro.vsock_port=1024 pyro.disks=env:vda,agent:vdb,state:vdc,seed:vdd";

const API_READY: Req = { method: "GET", path: "/", body: undefined };

function coldBootRequests(): Req[] {
  return [
    API_READY,
    { method: "PUT", path: "/machine-config", body: { vcpu_count: 2, mem_size_mib: 512, smt: false } },
    {
      method: "PUT",
      path: "/boot-source",
      body: {
        kernel_image_path: artifacts.image.vmlinux,
        initrd_path: artifacts.image.initrd,
        boot_args: BOOT_ARGS,
      },
    },
    ...(
      [
        ["pyro_env", "env.img", true],
        ["pyro_agent", "agent.img", true],
        ["pyro_state", "state.img", false],
        ["pyro_seed", "seed.img", true],
      ] as const
    ).map(([id, path, ro]) => ({
      method: "PUT",
      path: `/drives/${id}`,
      body: { drive_id: id, path_on_host: path, is_root_device: false, is_read_only: ro },
    })),
    { method: "PUT", path: "/vsock", body: { guest_cid: 3, uds_path: "vsock.sock" } },
    { method: "PUT", path: "/actions", body: { action_type: "InstanceStart" } },
  ];
}

describe("firecracker drive and kernel layout", () => {
  it("uses drive ids Firecracker accepts (alphanumerics and _ only)", () => {
    expect(["env", "agent", "state", "seed"].map((r) => driveId(r as "env"))).toEqual([
      "pyro_env",
      "pyro_agent",
      "pyro_state",
      "pyro_seed",
    ]);
    for (const d of driveConfigs()) expect(d.drive_id).toMatch(/^[A-Za-z0-9_]+$/);
  });

  it("tells the guest which device each disk is, in attach order", () => {
    expect(disksArg()).toBe("pyro.disks=env:vda,agent:vdb,state:vdc,seed:vdd");
    expect(driveConfigs().map((d) => d.path_on_host)).toEqual([
      "env.img",
      "agent.img",
      "state.img",
      "seed.img",
    ]);
    expect(bootArgs({ cmdline: ["a=1"] } as VmArtifacts)).toBe(
      "a=1 pyro.channel=vsock pyro.vsock_port=1024 pyro.disks=env:vda,agent:vdb,state:vdc,seed:vdd",
    );
  });
});

describe("FirecrackerBackend against a fake Firecracker", () => {
  it("cold-boots with the exact API sequence, reaches the agent over vsock, and stops keeping the state disk", async () => {
    const b = backend({ fastStart: false });
    const s = spec("ws_cold1");
    const state = await b.start(s);

    expect(fake.vms).toHaveLength(1);
    const vm = fake.vms[0]!;
    expect(vm.argv).toEqual([join(base, "bin", "firecracker"), "--api-sock", "fc.sock"]);
    expect(vm.cwd).toBe(s.dir);
    expect(vm.requests).toEqual(coldBootRequests());
    // Relative drive paths resolve in the workspace's directory to the right files.
    expect(vm.opened).toEqual({
      pyro_env: artifacts.envDisk,
      pyro_agent: artifacts.agentDisk,
      pyro_state: join(s.dir, "state.img"),
      pyro_seed: join(s.dir, "seeds", "initial.ext4"),
    });
    // The state filesystem is the disk limit (default 10 GiB).
    expect(blankCalls).toEqual([{ path: join(s.dir, "state.img"), sizeMib: DEFAULT_DISK_MIB }]);
    expect(typeof bridgeOption).toBe("function");
    expect(setupCalls).toEqual([{ hostname: "pyro-cold1" }]);
    expect(state).toMatchObject({
      backend: "firecracker",
      pid: vm.pid,
      api_socket: join(s.dir, "fc.sock"),
      vsock_socket: join(s.dir, "vsock.sock"),
      log: join(s.dir, "firecracker.log"),
      boot: "cold",
      template: null,
      fast_start_skipped: "fast start disabled",
    });
    expect(await b.isRunning(state)).toBe(true);

    const client = await AgentClient.connect(await b.connect(state), { timeoutMs: 2000 });
    expect(client.agent.version).toBe(PROTOCOL_VERSION);
    await client.request("ping", {});
    client.close();

    await b.stop(state);
    expect(syncCalls).toBe(1);
    expect(await b.isRunning(state)).toBe(false);
    expect(await sameProcessAlive(state.pid, state.start_time)).toBe(false);
    await expect(stat(join(s.dir, "fc.sock"))).rejects.toThrow();
    await expect(stat(join(s.dir, "vsock.sock"))).rejects.toThrow();
    expect(await readFile(join(s.dir, "state.img"), "utf8")).toBe("blank ext4");

    // Started again: the kept state disk is used as is.
    const again = await b.start(s);
    expect(blankCalls).toHaveLength(1);
    expect(fake.vms[1]!.requests).toEqual(coldBootRequests());
    await b.destroy(s, again);
    expect(await b.isRunning(again)).toBe(false);
    await expect(stat(s.dir)).rejects.toThrow();
  });

  it("carries published ports over the network mux on vsock port 1025 (the guest side is qemu's)", async () => {
    const b = backend({ fastStart: false });
    const state = await b.start(spec("ws_net1"));
    const echo = createNetServer((s) => s.pipe(s));
    await new Promise<void>((r) => echo.listen(0, "127.0.0.1", r));
    try {
      const wire = await b.connectNet(state, { timeoutMs: 2000 });
      const host = new NetMux(wire, "host", async () => {
        throw new Error("no egress in this test");
      });
      const { PassThrough, Duplex } = await import("node:stream");
      const toGuest = new PassThrough();
      const fromGuest = new PassThrough();
      const local = Duplex.from({ readable: toGuest, writable: fromGuest });
      await host.open({ kind: "port", port: (echo.address() as { port: number }).port }, local);
      toGuest.write("ping over vsock\n");
      const got = await new Promise<string>((r) => fromGuest.once("data", (d: Buffer) => r(d.toString())));
      expect(got).toBe("ping over vsock\n");
      host.close();
    } finally {
      echo.close();
      await b.stop(state);
    }
  });

  it("surfaces Firecracker's fault_message when it refuses the configuration, and leaves no process", async () => {
    fake.faults.set(
      "PUT /drives/pyro_state",
      "Unable to open the block device backing file: Permission denied",
    );
    const b = backend({ fastStart: false });
    const err = await b.start(spec("ws_fault")).catch((e: unknown) => e);
    expect(err).toMatchObject({
      code: "backend_unavailable",
      message:
        "firecracker API PUT /drives/pyro_state: Unable to open the block device backing file: Permission denied",
    });
    expect(await sameProcessAlive(fake.vms[0]!.pid, await procStartTime(fake.vms[0]!.pid))).toBe(false);
  });

  it("fails early with Firecracker's log when it dies during boot", async () => {
    fake.dieOnStart = true;
    const b = backend({ fastStart: false, bootTimeoutMs: 20_000 });
    const started = Date.now();
    await expect(b.start(spec("ws_dies"))).rejects.toMatchObject({
      code: "backend_unavailable",
      message: expect.stringMatching(/^firecracker exited during start: .*KVM_CREATE_VM failed: boom/),
    });
    expect(Date.now() - started).toBeLessThan(5000);
  });

  it("refuses to start without a firecracker binary", async () => {
    const b = new FirecrackerBackend({ env: { PATH: join(base, "empty") } });
    await expect(b.start(spec("ws_nobin"))).rejects.toMatchObject({
      code: "backend_unavailable",
      message: "no firecracker binary",
    });
  });

  it("refuses a guest image without an uncompressed kernel", async () => {
    artifacts.image.vmlinux = "";
    await expect(backend().start(spec("ws_novmlinux"))).rejects.toMatchObject({
      code: "backend_unavailable",
    });
  });

  it("fast start: builds the template once, then restores it onto each fresh workspace's own disks", async () => {
    const b = backend();
    const s1 = spec("ws_fast1");
    const st1 = await b.start(s1);

    // VM 0: the template, cold-booted in its own (temporary) directory, paused, snapshotted.
    const [tplVm, clone1] = fake.vms;
    expect(fake.vms).toHaveLength(2);
    const tplDir = tplVm!.cwd;
    expect(tplDir.startsWith(join(base, "templates", "."))).toBe(true);
    expect(tplVm!.requests).toEqual([
      ...coldBootRequests(),
      { method: "PATCH", path: "/vm", body: { state: "Paused" } },
      {
        method: "PUT",
        path: "/snapshot/create",
        body: {
          snapshot_type: "Full",
          snapshot_path: join(tplDir, "vm.snap"),
          mem_file_path: join(tplDir, "vm.mem"),
        },
      },
    ]);
    expect(await sameProcessAlive(tplVm!.pid, await procStartTime(tplVm!.pid))).toBe(false);

    // VM 1: the workspace, restored from the template in the workspace's directory.
    const key = String(st1.template);
    const tpl = join(base, "templates", key);
    expect(clone1!.cwd).toBe(s1.dir);
    expect(clone1!.requests).toEqual([
      API_READY,
      {
        method: "PUT",
        path: "/snapshot/load",
        body: {
          snapshot_path: join(tpl, "vm.snap"),
          mem_backend: { backend_type: "File", backend_path: join(tpl, "vm.mem") },
          resume_vm: false,
        },
      },
      {
        method: "PATCH",
        path: "/drives/pyro_seed",
        body: { drive_id: "pyro_seed", path_on_host: "seed.img" },
      },
      { method: "PATCH", path: "/vm", body: { state: "Resumed" } },
    ]);
    // The snapshot's relative paths now name this workspace's files.
    expect(clone1!.opened).toEqual({
      pyro_env: artifacts.envDisk,
      pyro_agent: artifacts.agentDisk,
      pyro_state: join(s1.dir, "state.img"),
      pyro_seed: join(s1.dir, "seeds", "initial.ext4"),
    });
    expect(st1).toMatchObject({ boot: "snapshot", template: key, pid: clone1!.pid });
    expect(st1.fast_start_skipped).toBeUndefined();
    // The clone's state disk is a writable copy of the template's.
    expect(await readFile(join(s1.dir, "state.img"), "utf8")).toBe("blank ext4");
    expect((await stat(join(s1.dir, "state.img"))).mode & 0o777).toBe(0o600);
    expect((await stat(join(tpl, "state.img"))).mode & 0o777).toBe(0o444);
    // Only the finished template: no temp directory, lock or failure record left.
    expect(await readdir(join(base, "templates"))).toEqual([key]);
    expect(setupCalls).toHaveLength(1);
    const client = await AgentClient.connect(await b.connect(st1), { timeoutMs: 2000 });
    client.close();

    // A second fresh workspace: restored at once, no new template.
    const s2 = spec("ws_fast2");
    const st2 = await b.start(s2);
    expect(fake.vms).toHaveLength(3);
    expect(calls(fake.vms[2]!)).toEqual([
      "GET /",
      "PUT /snapshot/load",
      "PATCH /drives/pyro_seed",
      "PATCH /vm",
    ]);
    expect(fake.vms[2]!.opened.pyro_state).toBe(join(s2.dir, "state.img"));
    expect(st2).toMatchObject({ boot: "snapshot", template: key });

    // A restart has its own state disk: cold boot.
    await b.stop(st1);
    const st1b = await b.start(s1);
    expect(fake.vms[3]!.requests).toEqual(coldBootRequests());
    expect(st1b).toMatchObject({ boot: "cold", template: null });
    expect(String(st1b.fast_start_skipped)).toContain("restart");

    // Other limits: another template.
    const s3 = spec("ws_fast3", { vcpus: 1, memory_mib: 256, pids_max: 256 });
    const st3 = await b.start(s3);
    expect(st3.template).not.toBe(key);
    expect(fake.vms).toHaveLength(6);
    // Another disk limit too: the template's state filesystem is that size.
    blankCalls.length = 0;
    const s4 = spec("ws_fast4", { vcpus: 2, memory_mib: 512, pids_max: 256, disk_mib: 128 } as never);
    const st4 = await b.start(s4);
    expect(st4.template).not.toBe(key);
    expect(blankCalls.map((c) => c.sizeMib)).toEqual([128]);
    for (const st of [st1b, st2, st3, st4]) await b.stop(st as SandboxState);
  });

  it("falls back to a cold boot when Firecracker refuses the snapshot, and skips that template afterwards", async () => {
    fake.faults.set("PUT /snapshot/load", "Load snapshot error: Failed to restore from snapshot");
    const b = backend();
    const s1 = spec("ws_fallback1");
    const st1 = await b.start(s1);
    expect(st1).toMatchObject({ boot: "cold", template: null });
    expect(String(st1.fast_start_skipped)).toMatch(
      /^restoring template [0-9a-f]+ failed: firecracker API PUT \/snapshot\/load: Load snapshot error/,
    );
    // template VM, failed clone, cold boot
    expect(fake.vms.map(calls).map((c) => c[1])).toEqual([
      "PUT /machine-config",
      "PUT /snapshot/load",
      "PUT /machine-config",
    ]);
    expect(await readFile(join(s1.dir, "state.img"), "utf8")).toBe("blank ext4");
    const failed = (await readdir(join(base, "templates"))).filter((f) => f.endsWith(".failed"));
    expect(failed).toHaveLength(1);

    const st2 = await b.start(spec("ws_fallback2"));
    expect(st2).toMatchObject({ boot: "cold" });
    expect(String(st2.fast_start_skipped)).toContain("failed before");
    expect(fake.vms).toHaveLength(4);
    expect(calls(fake.vms[3]!)[1]).toBe("PUT /machine-config");
    await b.stop(st1);
    await b.stop(st2);
  });

  it("cold-boots when the template cannot be built, and records why", async () => {
    fake.faults.set("PUT /snapshot/create", "Cannot create snapshot: No space left on device");
    const b = backend();
    const st = await b.start(spec("ws_notpl"));
    expect(st).toMatchObject({ boot: "cold" });
    expect(String(st.fast_start_skipped)).toContain("No space left on device");
    const names = await readdir(join(base, "templates"));
    expect(names.filter((f) => f.endsWith(".failed"))).toHaveLength(1);
    expect(names.filter((f) => f.startsWith("."))).toEqual([]);
    await b.stop(st);
  });

  it("discards the state disk and destroys every file and process", async () => {
    const b = backend({ fastStart: false });
    const s = spec("ws_discard");
    const st = await b.start(s);
    await b.stop(st);
    await b.discardChanges(s);
    await expect(stat(join(s.dir, "state.img"))).rejects.toThrow();
    const st2 = await b.start(s);
    expect(blankCalls).toHaveLength(2);
    await b.destroy(s, st2);
    expect(await b.isRunning(st2)).toBe(false);
    await expect(stat(s.dir)).rejects.toThrow();
  });

  it("sees the workspace at /workspace and snapshots under /run/pyro", () => {
    const b = backend();
    const s = spec("ws_paths");
    expect(b.name).toBe("firecracker");
    expect(b.executionMode).toBe("guest_agent");
    expect(b.agentRoot()).toBe("/workspace");
    expect(b.agentSnapshotPath(s, "initial")).toBe("/run/pyro/seed");
    expect(b.agentSnapshotPath(s, "before-refactor")).toBe("/run/pyro/snapshots/before-refactor");
  });

  it("connects to a stopped workspace's agent with a clear timeout", async () => {
    const b = backend({ fastStart: false });
    const s = spec("ws_conn");
    const st = await b.start(s);
    await b.stop(st);
    const started = Date.now();
    await expect(b.connect(st, { timeoutMs: 200 })).rejects.toMatchObject({ code: "timeout" });
    expect(Date.now() - started).toBeLessThan(2000);
  });
});
