import { mkdtemp, rm } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { FirecrackerApi, faultMessage } from "../../../src/backends/firecracker/api.js";
import { PyroError } from "../../../src/errors.js";

interface Recorded {
  method: string;
  path: string;
  contentType: string | undefined;
  body: unknown;
}

/** A stand-in for Firecracker's API server: records requests, answers 204 or a fault. */
async function fakeApi(socket: string) {
  const requests: Recorded[] = [];
  const faults = new Map<string, { status: number; body: string }>();
  let hang = false;
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const text = Buffer.concat(chunks).toString("utf8");
      requests.push({
        method: req.method ?? "",
        path: req.url ?? "",
        contentType: req.headers["content-type"],
        body: text ? JSON.parse(text) : undefined,
      });
      if (hang) return;
      const fault = faults.get(`${req.method} ${req.url}`);
      if (fault) {
        res.writeHead(fault.status, { "Content-Type": "application/json" });
        res.end(fault.body);
      } else {
        res.writeHead(204);
        res.end();
      }
    });
  });
  await new Promise<void>((r) => server.listen(socket, r));
  return {
    requests,
    faults,
    hangAll: () => {
      hang = true;
    },
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

let dir: string;
let api: Awaited<ReturnType<typeof fakeApi>>;
let client: FirecrackerApi;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-fc-api-"));
  api = await fakeApi(join(dir, "fc.sock"));
  client = new FirecrackerApi(join(dir, "fc.sock"), { timeoutMs: 2000 });
});

afterEach(async () => {
  await api.close();
  await rm(dir, { recursive: true, force: true });
});

describe("Firecracker API client", () => {
  it("sends each call with the method, path and JSON body of Firecracker's API", async () => {
    await client.putMachineConfig({ vcpu_count: 2, mem_size_mib: 1024, smt: false });
    await client.putBootSource({ kernel_image_path: "/k", initrd_path: "/i", boot_args: "console=ttyS0" });
    await client.putDrive("pyro_env", {
      drive_id: "pyro_env",
      path_on_host: "env.img",
      is_root_device: false,
      is_read_only: true,
    });
    await client.patchDrive("pyro_seed", { drive_id: "pyro_seed", path_on_host: "seed.img" });
    await client.putVsock({ guest_cid: 3, uds_path: "vsock.sock" });
    await client.instanceStart();
    await client.pause();
    await client.createSnapshot({
      snapshot_type: "Full",
      snapshot_path: "/t/vm.snap",
      mem_file_path: "/t/vm.mem",
    });
    await client.resume();
    await client.loadSnapshot({
      snapshot_path: "/t/vm.snap",
      mem_backend: { backend_type: "File", backend_path: "/t/vm.mem" },
      resume_vm: true,
    });
    expect(api.requests.map((r) => `${r.method} ${r.path}`)).toEqual([
      "PUT /machine-config",
      "PUT /boot-source",
      "PUT /drives/pyro_env",
      "PATCH /drives/pyro_seed",
      "PUT /vsock",
      "PUT /actions",
      "PATCH /vm",
      "PUT /snapshot/create",
      "PATCH /vm",
      "PUT /snapshot/load",
    ]);
    expect(api.requests.map((r) => r.body)).toEqual([
      { vcpu_count: 2, mem_size_mib: 1024, smt: false },
      { kernel_image_path: "/k", initrd_path: "/i", boot_args: "console=ttyS0" },
      { drive_id: "pyro_env", path_on_host: "env.img", is_root_device: false, is_read_only: true },
      { drive_id: "pyro_seed", path_on_host: "seed.img" },
      { guest_cid: 3, uds_path: "vsock.sock" },
      { action_type: "InstanceStart" },
      { state: "Paused" },
      { snapshot_type: "Full", snapshot_path: "/t/vm.snap", mem_file_path: "/t/vm.mem" },
      { state: "Resumed" },
      {
        snapshot_path: "/t/vm.snap",
        mem_backend: { backend_type: "File", backend_path: "/t/vm.mem" },
        resume_vm: true,
      },
    ]);
    expect(api.requests.every((r) => r.contentType === "application/json")).toBe(true);
  });

  it("surfaces Firecracker's fault_message in a backend_unavailable error", async () => {
    api.faults.set("PUT /drives/pyro_env", {
      status: 400,
      body: JSON.stringify({ fault_message: "Unable to open the block device backing file: No such file" }),
    });
    const err = await client
      .putDrive("pyro_env", {
        drive_id: "pyro_env",
        path_on_host: "x",
        is_root_device: false,
        is_read_only: true,
      })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(PyroError);
    expect(err).toMatchObject({
      code: "backend_unavailable",
      message:
        "firecracker API PUT /drives/pyro_env: Unable to open the block device backing file: No such file",
    });
  });

  it("reports a non-JSON error body with its HTTP status", async () => {
    api.faults.set("PUT /actions", { status: 500, body: "boom" });
    await expect(client.instanceStart()).rejects.toMatchObject({
      code: "backend_unavailable",
      message: "firecracker API PUT /actions: HTTP 500: boom",
    });
    expect(faultMessage("", 404)).toBe("HTTP 404");
  });

  it("times out a request Firecracker never answers", async () => {
    api.hangAll();
    const quick = new FirecrackerApi(join(dir, "fc.sock"), { timeoutMs: 200 });
    const started = Date.now();
    await expect(quick.instanceStart()).rejects.toMatchObject({
      code: "timeout",
      message: "firecracker API PUT /actions: no answer within 200 ms",
    });
    expect(Date.now() - started).toBeLessThan(2000);
  });

  it("fails clearly when nothing listens on the API socket", async () => {
    const nowhere = new FirecrackerApi(join(dir, "missing.sock"), { timeoutMs: 1000 });
    await expect(nowhere.pause()).rejects.toMatchObject({
      code: "backend_unavailable",
      message: expect.stringMatching(/^firecracker API PATCH \/vm: cannot reach .*missing\.sock: .*ENOENT/),
    });
  });

  it("is cancelled by its AbortSignal", async () => {
    api.hangAll();
    const ac = new AbortController();
    const slow = new FirecrackerApi(join(dir, "fc.sock"), { timeoutMs: 5000, signal: ac.signal });
    const p = slow.resume();
    setTimeout(() => ac.abort(), 50);
    await expect(p).rejects.toMatchObject({ code: "cancelled" });
  });
});
