import { mkdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { Readable } from "node:stream";
import { afterEach, describe, expect, it } from "vitest";
import { AgentError } from "../../../src/agent/errors.js";
import { parseGuestArgs } from "../../../src/agent/guest/agent.js";
import type { OpContext } from "../../../src/agent/guest/ops/context.js";
import { vmSetup, vmSnapshotIn, vmSync } from "../../../src/agent/guest/ops/vm.js";
import { Workspace } from "../../../src/agent/guest/paths.js";
import { findPorts } from "../../../src/agent/guest/serial.js";
import { SERIAL_PORT_PREFIX } from "../../../src/backends/vm/agent-disk.js";
import { startAgent, tempDir } from "../agent/helpers.js";

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function scratch(): Promise<string> {
  const t = await tempDir("pyro-vm-guest-");
  cleanups.push(t.cleanup);
  return t.dir;
}

/** A fake /sys/class/virtio-ports: one directory per port, `name` holding its name. */
async function fakeSysfs(ports: Record<string, string | null>): Promise<string> {
  const sys = path.join(await scratch(), "virtio-ports");
  for (const [entry, name] of Object.entries(ports)) {
    await mkdir(path.join(sys, entry), { recursive: true });
    if (name !== null) await writeFile(path.join(sys, entry, "name"), name);
  }
  return sys;
}

describe("findPorts", () => {
  it("returns the device of every matching port, in numeric name order", async () => {
    const sys = await fakeSysfs({
      vport0p1: "pyro.agent.10\n",
      vport0p2: "pyro.agent.2\n",
      vport0p3: "org.qemu.guest_agent.0\n",
      vport0p4: "pyro.agent.0\n",
      vport0p5: null, // no name file
      vport0p6: "\n", // unnamed port
      vport1p1: "pyro.agent.1\n",
    });
    expect(await findPorts(SERIAL_PORT_PREFIX, sys)).toEqual([
      "/dev/vport0p4",
      "/dev/vport1p1",
      "/dev/vport0p2",
      "/dev/vport0p1",
    ]);
  });

  it("matches names by prefix only", async () => {
    const sys = await fakeSysfs({ vport0p1: "xpyro.agent.1\n", vport0p2: "pyro.agent.1\n" });
    expect(await findPorts(SERIAL_PORT_PREFIX, sys)).toEqual(["/dev/vport0p2"]);
    expect(await findPorts("other.", sys)).toEqual([]);
  });

  it("finds nothing when there is no virtio-ports directory", async () => {
    expect(await findPorts(SERIAL_PORT_PREFIX, path.join(await scratch(), "absent"))).toEqual([]);
  });
});

describe("parseGuestArgs in a VM", () => {
  const invalid = expect.objectContaining({ code: "invalid_argument" }) as unknown as Error;

  it("accepts --serial with --vm", () => {
    expect(
      parseGuestArgs(["--root", "/workspace", "--serial", "pyro.agent.", "--vm", "/run/pyro/agent"]),
    ).toEqual({ root: "/workspace", serial: "pyro.agent.", vm: "/run/pyro/agent" });
    expect(parseGuestArgs(["--vm", "/a", "--listen", "/s", "--root", "/w"])).toEqual({
      root: "/w",
      listen: "/s",
      vm: "/a",
    });
  });

  it("refuses two channels together, and none at all", () => {
    for (const bad of [
      ["--root", "/w", "--serial", "p.", "--listen", "/s"],
      ["--root", "/w", "--serial", "p.", "--stdio"],
      ["--root", "/w", "--stdio", "--listen", "/s", "--serial", "p."],
      ["--root", "/w", "--vm", "/a"],
      ["--root", "/w"],
    ]) {
      expect(() => parseGuestArgs(bad), bad.join(" ")).toThrow(invalid);
      expect(() => parseGuestArgs(bad)).toThrow(/exactly one of --listen, --stdio and --serial/);
    }
  });

  it("refuses --serial and --vm without a value", () => {
    expect(() => parseGuestArgs(["--root", "/w", "--serial"])).toThrow(invalid);
    expect(() => parseGuestArgs(["--root", "/w", "--serial", "--vm", "/a"])).toThrow(
      /--serial needs a value/,
    );
    expect(() => parseGuestArgs(["--root", "/w", "--stdio", "--vm"])).toThrow(/--vm needs a value/);
  });
});

describe("vm_* ops outside a VM", () => {
  async function ctx(): Promise<OpContext> {
    return {
      workspace: await Workspace.open(await scratch()),
      signal: new AbortController().signal,
      upload: null,
      send: async () => {},
      tmpDir: await scratch(),
      vmDir: null,
    };
  }

  function expectRefused(err: unknown): void {
    expect(err).toBeInstanceOf(AgentError);
    expect((err as AgentError).code).toBe("invalid_argument");
    expect((err as AgentError).message).toMatch(/only inside a pyro microVM/);
  }

  it("refuse with invalid_argument when the agent has no VM directory", async () => {
    const c = await ctx();
    expectRefused(
      await vmSetup({ time_ms: Date.now(), entropy: "", hostname: "pyro" }, c).catch((e: unknown) => e),
    );
    expectRefused(await vmSync({}, c).catch((e: unknown) => e));
    expectRefused(
      await vmSnapshotIn({ name: "base" }, { ...c, upload: Readable.from([]) }).catch((e: unknown) => e),
    );
  });

  it("are refused the same way through a session of an agent started without --vm", async () => {
    const agent = await startAgent();
    cleanups.push(agent.cleanup);
    expectRefused(await agent.client.request("vm_sync", {}).catch((e: unknown) => e));
    expectRefused(
      await agent.client
        .request("vm_setup", { time_ms: Date.now(), entropy: "", hostname: "pyro" })
        .catch((e: unknown) => e),
    );
    // The session survives the refusals.
    expect((await agent.client.request("ping", {})).time_ms).toBeGreaterThan(0);
  });
});
