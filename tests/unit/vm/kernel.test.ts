import { describe, expect, it } from "vitest";
import { GUEST_MODULES, modinfoDepends, moduleLoadOrder } from "../../../src/backends/vm/kernel.js";
import { PyroError } from "../../../src/errors.js";

/** A .ko-like buffer: some ELF-ish bytes, then a NUL-separated .modinfo section. */
function ko(...modinfo: string[]): Buffer {
  return Buffer.concat([
    Buffer.from([0x7f, 0x45, 0x4c, 0x46, 2, 1, 1, 0]),
    Buffer.from("\0__UNIQUE_ID_depends123\0", "latin1"),
    Buffer.from(`\0${modinfo.join("\0")}\0`, "latin1"),
    Buffer.from([0xde, 0xad, 0xbe, 0xef]),
  ]);
}

/** A fake kernel's module graph, shaped like Debian's cloud kernel. */
const GRAPH: Record<string, string[]> = {
  virtio_ring: [],
  virtio: ["virtio_ring"],
  virtio_mmio: ["virtio", "virtio_ring"],
  virtio_blk: ["virtio", "virtio_ring"],
  virtio_console: ["virtio", "virtio_ring"],
  overlay: [],
  vsock: [],
  vmw_vsock_virtio_transport_common: ["vsock"],
  vmw_vsock_virtio_transport: ["vmw_vsock_virtio_transport_common", "virtio", "virtio_ring", "vsock"],
};

function depsOf(graph: Record<string, string[]>) {
  const asked: string[] = [];
  const fn = (m: string) => {
    asked.push(m);
    return Object.hasOwn(graph, m) ? graph[m]! : null;
  };
  return { fn, asked };
}

function caught(f: () => unknown): PyroError {
  try {
    f();
  } catch (err) {
    return err as PyroError;
  }
  throw new Error("expected a throw");
}

describe("modinfoDepends", () => {
  it("parses the depends= field, turning dashes into underscores", () => {
    const buf = ko("license=GPL", "depends=virtio,virtio_ring,vmw-vsock-virtio-transport-common", "intree=Y");
    expect(modinfoDepends(buf)).toEqual(["virtio", "virtio_ring", "vmw_vsock_virtio_transport_common"]);
  });

  it("returns [] when the field is missing or empty", () => {
    expect(modinfoDepends(ko("license=GPL", "name=overlay"))).toEqual([]);
    expect(modinfoDepends(ko("license=GPL", "depends=", "name=vsock"))).toEqual([]);
    expect(modinfoDepends(Buffer.alloc(0))).toEqual([]);
  });

  it("reads up to the end of the buffer when the value is not NUL-terminated", () => {
    expect(modinfoDepends(Buffer.from("xx\0depends=a-b,c", "latin1"))).toEqual(["a_b", "c"]);
  });

  it("does not take a symbol name that merely contains 'depends' for the field", () => {
    // Only the \0depends= marker counts, not "__UNIQUE_ID_depends123".
    expect(modinfoDepends(Buffer.from("\0__UNIQUE_ID_depends=zzz\0", "latin1"))).toEqual([]);
  });
});

describe("moduleLoadOrder", () => {
  it("puts dependencies first and lists each module once", () => {
    const { fn } = depsOf(GRAPH);
    const order = moduleLoadOrder(GUEST_MODULES, fn);
    expect(new Set(order).size).toBe(order.length);
    expect(new Set(order)).toEqual(new Set(Object.keys(GRAPH)));
    for (const [m, deps] of Object.entries(GRAPH))
      for (const d of deps) expect(order.indexOf(d), `${d} before ${m}`).toBeLessThan(order.indexOf(m));
    // Depth-first in the order asked for.
    expect(order.slice(0, 3)).toEqual(["virtio_ring", "virtio", "virtio_mmio"]);
  });

  it("asks for each module's dependencies once", () => {
    const { fn, asked } = depsOf(GRAPH);
    moduleLoadOrder(["virtio_blk", "virtio_console", "virtio_blk"], fn);
    expect(asked.filter((m) => m === "virtio_ring")).toHaveLength(1);
    expect(asked.filter((m) => m === "virtio_blk")).toHaveLength(1);
  });

  it("returns only what the wanted modules pull in", () => {
    expect(moduleLoadOrder(["overlay"], depsOf(GRAPH).fn)).toEqual(["overlay"]);
    expect(moduleLoadOrder(["vmw_vsock_virtio_transport_common"], depsOf(GRAPH).fn)).toEqual([
      "vsock",
      "vmw_vsock_virtio_transport_common",
    ]);
    expect(moduleLoadOrder([], depsOf(GRAPH).fn)).toEqual([]);
  });

  it("refuses a dependency cycle, naming it", () => {
    const err = caught(() => moduleLoadOrder(["a"], depsOf({ a: ["b"], b: ["c"], c: ["a"] }).fn));
    expect(err).toBeInstanceOf(PyroError);
    expect(err.code).toBe("internal");
    expect(err.message).toContain("a -> b -> c -> a");
  });

  it("refuses a self-dependency", () => {
    const err = caught(() => moduleLoadOrder(["a"], depsOf({ a: ["a"] }).fn));
    expect(err.code).toBe("internal");
    expect(err.message).toContain("a -> a");
  });

  it("names the chain that leads to a missing module", () => {
    const graph = { ...GRAPH, virtio: ["virtio_ring", "virtio_missing"] };
    const err = caught(() => moduleLoadOrder(["virtio_blk"], depsOf(graph).fn));
    expect(err).toBeInstanceOf(PyroError);
    expect(err.code).toBe("internal");
    expect(err.message).toContain("virtio_missing");
    expect(err.message).toContain("virtio_blk -> virtio");
  });

  it("says a missing wanted module was wanted", () => {
    const err = caught(() => moduleLoadOrder(["nope"], depsOf(GRAPH).fn));
    expect(err.code).toBe("internal");
    expect(err.message).toMatch(/no module nope \(wanted\)/);
  });
});
