import { mkdir, readFile, writeFile } from "node:fs/promises";
import { release } from "node:os";
import path from "node:path";
import type { Duplex } from "node:stream";
import { afterEach, describe, expect, it } from "vitest";
import { AgentError } from "../../../src/agent/errors.js";
import type { OpContext, OpHandler } from "../../../src/agent/guest/ops/context.js";
import { BUILTIN_OPS } from "../../../src/agent/guest/ops/index.js";
import { vmSetup } from "../../../src/agent/guest/ops/vm.js";
import { Workspace } from "../../../src/agent/guest/paths.js";
import type { OpParsedArgs } from "../../../src/agent/op-schemas.js";
import { serveConnection } from "../../../src/agent/server.js";
import { setupGuest } from "../../../src/backends/vm/setup.js";
import { DISK_SERIAL, GUEST, SETUP_HELPER } from "../../../src/backends/vm/types.js";
import { duplexPair, tempDir } from "../agent/helpers.js";

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** An in-process agent whose vm_setup is `vmSetup`; `connect` hands out the host end once. */
async function fakeGuest(vmSetup: OpHandler<"vm_setup">) {
  const t = await tempDir("pyro-vm-setup-");
  cleanups.push(t.cleanup);
  const root = path.join(t.dir, "root");
  await mkdir(root);
  const [hostEnd, agentEnd] = duplexPair();
  const served = serveConnection(agentEnd, {
    workspace: await Workspace.open(root),
    handlers: { ...BUILTIN_OPS, vm_setup: vmSetup },
    tmpDir: t.dir,
    vmDir: path.join(t.dir, "agent-disk"),
  });
  let connects = 0;
  const connect = async (): Promise<Duplex> => {
    connects++;
    return hostEnd;
  };
  cleanups.push(async () => {
    hostEnd.destroy();
    await served;
  });
  return { connect, served, hostEnd, connects: () => connects };
}

/** Settles with `p`, or rejects after `ms`. */
function within<T>(p: Promise<T>, ms: number): Promise<T> {
  return Promise.race([
    p,
    new Promise<T>((_, reject) => setTimeout(() => reject(new Error(`not settled within ${ms} ms`)), ms)),
  ]);
}

describe("setupGuest", () => {
  it("hands the agent the clock, 64 bytes of entropy and the hostname, then closes", async () => {
    const calls: { args: OpParsedArgs<"vm_setup">; vmDir: string | null }[] = [];
    const guest = await fakeGuest(async (args, ctx) => {
      calls.push({ args, vmDir: ctx.vmDir });
      return { mounted: true, kernel: "6.1.0-42-cloud-amd64", duration_ms: 12, shell_ms: 7 };
    });
    const before = Date.now();
    const r = await setupGuest(guest.connect, { timeoutMs: 5000, hostname: "ws-one" });
    const after = Date.now();

    expect(r.kernel).toBe("6.1.0-42-cloud-amd64");
    expect(r.answered_ms).toBeGreaterThanOrEqual(0);
    expect(r.answered_ms).toBeLessThan(5000);
    expect(guest.connects()).toBe(1);
    expect(calls).toHaveLength(1);
    const { args } = calls[0]!;
    expect(args.time_ms).toBeGreaterThanOrEqual(before);
    expect(args.time_ms).toBeLessThanOrEqual(after);
    expect(Buffer.from(args.entropy, "base64")).toHaveLength(64);
    expect(args.hostname).toBe("ws-one");
    expect(calls[0]!.vmDir).toMatch(/agent-disk$/);
    // The client hung up: the agent's session ends.
    expect(await within(guest.served, 2000)).toBeDefined();
  });

  it("sends fresh entropy every time and defaults the hostname to pyro", async () => {
    const entropy: string[] = [];
    const hostnames: string[] = [];
    for (let i = 0; i < 2; i++) {
      const guest = await fakeGuest(async (args) => {
        entropy.push(args.entropy);
        hostnames.push(args.hostname);
        return { mounted: false, kernel: "k", duration_ms: 1, shell_ms: 1 };
      });
      expect((await setupGuest(guest.connect, { timeoutMs: 5000 })).kernel).toBe("k");
    }
    expect(hostnames).toEqual(["pyro", "pyro"]);
    expect(entropy[0]).not.toBe(entropy[1]);
  });

  it("rejects with the agent's error when vm_setup fails, and still closes", async () => {
    const guest = await fakeGuest(async () => {
      throw new AgentError("internal", "mount -t overlay: boom");
    });
    const err = (await setupGuest(guest.connect, { timeoutMs: 5000 }).catch((e: unknown) => e)) as AgentError;
    expect(err).toBeInstanceOf(AgentError);
    expect(err.code).toBe("internal");
    expect(err.message).toContain("boom");
    expect(await within(guest.served, 2000)).toBeDefined();
  });

  it("rejects when the agent never answers the handshake", async () => {
    const [hostEnd] = duplexPair();
    cleanups.push(async () => {
      hostEnd.destroy();
    });
    const started = Date.now();
    const err = (await setupGuest(async () => hostEnd, { timeoutMs: 200 }).catch(
      (e: unknown) => e,
    )) as AgentError;
    expect(err).toBeInstanceOf(AgentError);
    expect(err.code).toBe("timeout");
    expect(Date.now() - started).toBeLessThan(3000);
    expect(hostEnd.destroyed).toBe(true);
  });

  it("can be cancelled while vm_setup runs", async () => {
    const controller = new AbortController();
    const guest = await fakeGuest(
      (_args, ctx) =>
        new Promise((_, reject) => {
          controller.abort();
          ctx.signal.addEventListener("abort", () => reject(new AgentError("cancelled", "stopped")));
        }),
    );
    const err = (await setupGuest(guest.connect, { timeoutMs: 5000, signal: controller.signal }).catch(
      (e: unknown) => e,
    )) as AgentError;
    expect(err).toBeInstanceOf(AgentError);
    expect(err.code).toBe("cancelled");
    expect(await within(guest.served, 2000)).toBeDefined();
  });
});

/** A fake `pyro-vmsetup` on a fake agent disk: logs its argv, prints `reply`, exits `code`. */
async function fakeHelperDisk(reply: string, code: number) {
  const t = await tempDir("pyro-vm-helper-");
  cleanups.push(t.cleanup);
  const vmDir = path.join(t.dir, "agent-disk");
  await mkdir(path.join(vmDir, "bin"), { recursive: true });
  const argvLog = path.join(t.dir, "argv");
  await writeFile(
    path.join(vmDir, "bin", SETUP_HELPER),
    `#!/bin/sh\nprintf '%s\\n' "$@" > '${argvLog}'\necho '${reply}'\nexit ${code}\n`,
    { mode: 0o755 },
  );
  const ctx = { vmDir } as unknown as OpContext;
  return { ctx, argv: async () => (await readFile(argvLog, "utf8")).trim().split("\n") };
}

describe("vm_setup in the guest (the setup helper; its server is not running on this host)", () => {
  const entropy = Buffer.alloc(64, 7);
  const args = { time_ms: 1_795_000_000_123, entropy: entropy.toString("base64"), hostname: "ws-one" };

  it("runs the helper once with the guest's layout, the clock, the entropy and the hostname", async () => {
    const disk = await fakeHelperDisk("ok mounted=1", 0);
    const r = await vmSetup(args, disk.ctx);
    expect(r).toMatchObject({ mounted: true, kernel: release() });
    expect(await disk.argv()).toEqual([
      "--once",
      DISK_SERIAL.seed,
      GUEST.seedDir,
      GUEST.workspaceUpper,
      GUEST.workspaceWork,
      GUEST.workspace,
      "ws-one",
      "1795000000123",
      entropy.toString("hex"),
    ]);
  });

  it("mount: false (the template) asks for no mount", async () => {
    const disk = await fakeHelperDisk("ok mounted=0", 0);
    expect((await vmSetup({ ...args, mount: false }, disk.ctx)).mounted).toBe(false);
    expect((await disk.argv()).at(-1)).toBe("nomount");
  });

  it("the helper's error is the op's error", async () => {
    const disk = await fakeHelperDisk("error mount overlay on /workspace: boom", 1);
    const err = (await vmSetup(args, disk.ctx).catch((e: unknown) => e)) as AgentError;
    expect(err).toBeInstanceOf(AgentError);
    expect(err.code).toBe("internal");
    expect(err.message).toBe(`${SETUP_HELPER}: mount overlay on /workspace: boom`);
  });
});
