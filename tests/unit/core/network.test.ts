import { fileURLToPath } from "node:url";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { WorkspaceBackend } from "../../../src/backends/backend.js";
import { PyroError } from "../../../src/errors.js";
import type { NetworkPolicy, PublishedPort, WorkspaceRow } from "../../../src/state/types.js";

/**
 * The network side of core (issue 13) without a sandbox or a helper process: parsing
 * and checking of policies and published ports, what a backend without `connectPort`
 * refuses, approvals, the helper's per-connection decision and the proxy variables.
 */
const network = () => import("../../../src/core/network.js");

/** Runs `f`, expecting a PyroError; returns it. */
function refusal(f: () => unknown): PyroError {
  try {
    f();
  } catch (err) {
    expect(err).toBeInstanceOf(PyroError);
    return err as PyroError;
  }
  throw new Error("expected a PyroError, nothing was thrown");
}

function invalid(f: () => unknown): PyroError {
  const e = refusal(f);
  expect(e.code).toBe("invalid_argument");
  expect(e.message.length).toBeLessThanOrEqual(200);
  return e;
}

/** A row with only what the network code reads. */
function row(policy: string, approved?: string[], extra: Partial<WorkspaceRow["spec"]> = {}): WorkspaceRow {
  return {
    workspace_id: "ws_test",
    network_policy: policy as NetworkPolicy,
    spec: {
      vcpus: 1,
      memory_mib: 256,
      env: {},
      timeout_seconds: 30,
      ...(approved ? { network_approved: approved } : {}),
      ...extra,
    },
  } as unknown as WorkspaceRow;
}

const ports = (...pairs: [number, number][]): PublishedPort[] =>
  pairs.map(([host_port, guest_port]) => ({ host_port, guest_port }));

describe("parsePublish", () => {
  it("accepts HOST:GUEST, host port 0 and a loopback host address", async () => {
    const { parsePublish } = await network();
    expect(parsePublish("8080:80")).toEqual({ host_port: 8080, guest_port: 80 });
    expect(parsePublish("0:3000")).toEqual({ host_port: 0, guest_port: 3000 });
    expect(parsePublish("127.0.0.1:8080:80")).toEqual({ host_port: 8080, guest_port: 80 });
    expect(parsePublish("localhost:1:1")).toEqual({ host_port: 1, guest_port: 1 });
    expect(parsePublish("65535:65535")).toEqual({ host_port: 65535, guest_port: 65535 });
  });

  const bad = [
    "0.0.0.0:80:80",
    "192.168.1.2:80:80",
    "80",
    ":80",
    "80:",
    "70000:80",
    "80:0",
    "80:70000",
    "a:b",
    "-1:80",
    "80:80:80",
    " 80:80",
    "",
    "9".repeat(10_000),
    `${"x".repeat(10_000)}:80`,
  ];
  for (const text of bad) {
    it(`refuses ${JSON.stringify(text.length > 40 ? `${text.slice(0, 20)}… (${text.length} chars)` : text)} with a hint`, async () => {
      const { parsePublish } = await network();
      const e = invalid(() => parsePublish(text));
      expect(e.hint).toMatch(/HOST_PORT:GUEST_PORT/);
    });
  }
});

describe("checkPublishedPorts", () => {
  it("passes valid ports through, copied, and undefined as none", async () => {
    const { checkPublishedPorts } = await network();
    expect(checkPublishedPorts(undefined)).toEqual([]);
    const given = [{ host_port: 8080, guest_port: 80, extra: 1 } as PublishedPort];
    expect(checkPublishedPorts(given)).toEqual([{ host_port: 8080, guest_port: 80 }]);
  });

  it("refuses a nonzero host port published twice, but not two host ports 0", async () => {
    const { checkPublishedPorts } = await network();
    invalid(() => checkPublishedPorts(ports([8080, 80], [8080, 81])));
    expect(checkPublishedPorts(ports([0, 80], [0, 81]))).toEqual(ports([0, 80], [0, 81]));
    // The same guest port on two host ports is fine.
    expect(checkPublishedPorts(ports([8080, 80], [8081, 80]))).toHaveLength(2);
  });

  it("refuses more than 32 entries", async () => {
    const { checkPublishedPorts } = await network();
    const many = (n: number) => Array.from({ length: n }, (_, i) => ({ host_port: 0, guest_port: i + 1 }));
    expect(checkPublishedPorts(many(32))).toHaveLength(32);
    expect(invalid(() => checkPublishedPorts(many(33))).message).toMatch(/32/);
  });

  it("refuses non-integers and out-of-range numbers", async () => {
    const { checkPublishedPorts } = await network();
    for (const p of [
      { host_port: 1.5, guest_port: 80 },
      { host_port: 80, guest_port: 1.5 },
      { host_port: Number.NaN, guest_port: 80 },
      { host_port: Number.POSITIVE_INFINITY, guest_port: 80 },
      { host_port: "80", guest_port: 80 },
      { host_port: 80, guest_port: null },
      { host_port: -1, guest_port: 80 },
      { host_port: 65536, guest_port: 80 },
      { host_port: 80, guest_port: 0 },
      { host_port: "9".repeat(5000), guest_port: 80 },
    ]) {
      const e = invalid(() => checkPublishedPorts([p as unknown as PublishedPort]));
      expect(e.hint).toMatch(/HOST_PORT:GUEST_PORT/);
    }
  });
});

describe("parseNetworkPolicy", () => {
  it("defaults to off and canonicalises", async () => {
    const { parseNetworkPolicy } = await network();
    expect(parseNetworkPolicy(undefined)).toBe("off");
    expect(parseNetworkPolicy("off")).toBe("off");
    expect(parseNetworkPolicy(" EGRESS ")).toBe("egress");
    expect(parseNetworkPolicy("allowlist:B.example,a.example:443")).toBe("allowlist:b.example,a.example:443");
    expect(parseNetworkPolicy("ALLOWLIST:a.example, a.example ,*.GitHub.com.:443")).toBe(
      "allowlist:a.example,*.github.com:443",
    );
    expect(parseNetworkPolicy("allowlist:[2001:DB8:0::1]:8443")).toBe("allowlist:[2001:db8::1]:8443");
  });

  for (const text of [
    "allowlist:",
    "allowlist:,",
    "allowlist: ",
    "allowlist:a.example,",
    "bogus",
    "",
    "allowlist:*",
    "allowlist:*.",
    "allowlist:a.*.example",
    "allowlist:a.example:0",
    "allowlist:a.example:70000",
    "allowlist:::1",
    "allowlist:127.1",
    `allowlist:${"a".repeat(5000)}`,
  ]) {
    it(`refuses ${JSON.stringify(text.length > 40 ? `${text.slice(0, 20)}…` : text)}`, async () => {
      const { parseNetworkPolicy } = await network();
      const e = invalid(() => parseNetworkPolicy(text));
      expect(e.hint).toMatch(/allowlist:HOST/);
    });
  }
});

describe("checkNetworkSupport", () => {
  const without = { name: "docker", connectPort: undefined } as unknown as WorkspaceBackend;
  const withPort = {
    name: "bwrap",
    connectPort: async () => {
      throw new Error("never dialled");
    },
  } as unknown as WorkspaceBackend;

  it("lets off without published ports through on every backend", async () => {
    const { checkNetworkSupport } = await network();
    expect(() => checkNetworkSupport(without, "off", [])).not.toThrow();
    expect(() => checkNetworkSupport(withPort, "off", [])).not.toThrow();
  });

  it("lets policies and published ports through where the backend can connect a port", async () => {
    const { checkNetworkSupport } = await network();
    for (const policy of ["egress", "allowlist:a.example"] as NetworkPolicy[])
      expect(() => checkNetworkSupport(withPort, policy, ports([0, 80]))).not.toThrow();
    expect(() => checkNetworkSupport(withPort, "off", ports([8080, 80]))).not.toThrow();
  });

  it("refuses policies and published ports as backend_unavailable without connectPort", async () => {
    const { checkNetworkSupport } = await network();
    for (const [policy, list] of [
      ["egress", []],
      ["allowlist:a.example", []],
      ["off", ports([8080, 80])],
      ["egress", ports([0, 80])],
    ] as [NetworkPolicy, PublishedPort[]][]) {
      const e = refusal(() => checkNetworkSupport(without, policy, list));
      expect(e.code).toBe("backend_unavailable");
      expect(e.message).toMatch(/docker/);
      expect(e.hint).toBeTruthy();
    }
    expect(refusal(() => checkNetworkSupport(without, "off", ports([8080, 80]))).message).toMatch(
      /published ports/,
    );
  });
});

describe("approvedPolicy", () => {
  it("refuses an approval on a workspace whose policy is off (conflict)", async () => {
    const { approvedPolicy } = await network();
    const e = refusal(() => approvedPolicy(row("off"), "example.com"));
    expect(e.code).toBe("conflict");
    expect(e.hint).toMatch(/--network allowlist:example\.com/);
  });

  it("keeps egress and records the target once (idempotent)", async () => {
    const { approvedPolicy } = await network();
    const first = approvedPolicy(row("egress"), "Example.COM");
    expect(first).toEqual({ policy: "egress", approved: ["example.com"], target: "example.com" });
    const again = approvedPolicy(row("egress", first.approved), "example.com");
    expect(again.approved).toEqual(["example.com"]);
    const other = approvedPolicy(row("egress", first.approved), "pypi.org:443");
    expect(other.approved).toEqual(["example.com", "pypi.org:443"]);
  });

  it("adds the target to an allowlist, once", async () => {
    const { approvedPolicy } = await network();
    const r = approvedPolicy(row("allowlist:a.example"), "B.example:443");
    expect(r).toEqual({
      policy: "allowlist:a.example,b.example:443",
      approved: ["b.example:443"],
      target: "b.example:443",
    });
    const again = approvedPolicy(row(r.policy, r.approved), "b.example:443");
    expect(again.policy).toBe("allowlist:a.example,b.example:443");
    expect(again.approved).toEqual(["b.example:443"]);
  });

  it("formats host:port and bracketed IPv6 with a port", async () => {
    const { approvedPolicy } = await network();
    expect(approvedPolicy(row("egress"), "10.0.0.1:8080").target).toBe("10.0.0.1:8080");
    expect(approvedPolicy(row("egress"), "[::1]:8080").target).toBe("[::1]:8080");
    expect(approvedPolicy(row("egress"), "[2001:DB8:0::1]:443").target).toBe("[2001:db8::1]:443");
    expect(approvedPolicy(row("allowlist:a.example"), "[::1]:8080").policy).toBe(
      "allowlist:a.example,[::1]:8080",
    );
    expect(approvedPolicy(row("egress"), "*.Example.com").target).toBe("*.example.com");
  });

  // src bug (reported): a bracketed IPv6 target without a port is formatted bare ("::1"),
  // which parseTarget/parsePolicy refuse: on allowlist the approval fails, on egress it is
  // stored and every later decideFor throws. `.fails` until approvedPolicy uses formatRule.
  it("formats a bracketed IPv6 target without a port in brackets", async () => {
    const { approvedPolicy } = await network();
    expect(approvedPolicy(row("egress"), "[::1]").target).toBe("[::1]");
    expect(approvedPolicy(row("allowlist:a.example"), "[::1]").policy).toBe("allowlist:a.example,[::1]");
  });

  for (const target of ["", "*", "a b", "example.com:0", "example.com:70000", "::1", "x".repeat(400), "a,b"])
    it(`refuses the target ${JSON.stringify(target.slice(0, 20))} as invalid_argument`, async () => {
      const { approvedPolicy } = await network();
      for (const policy of ["egress", "allowlist:a.example", "off"])
        invalid(() => approvedPolicy(row(policy), target));
    });
});

describe("decideFor (core/netd.ts)", () => {
  const netd = () => import("../../../src/core/netd.js");

  it("refuses everything for a workspace that is gone", async () => {
    const { decideFor } = await netd();
    expect(decideFor(null, "example.com", 443)).toEqual({ allowed: false, reason: expect.any(String) });
  });

  it("allows an approved target with trustPrivate, whatever the policy", async () => {
    const { decideFor } = await netd();
    for (const policy of ["egress", "allowlist:a.example", "off"])
      expect(decideFor(row(policy, ["db.internal"]), "DB.internal.", 5432)).toEqual({
        allowed: true,
        trustPrivate: true,
      });
  });

  it("allows an allowlist match without trustPrivate and refuses the rest with a reason", async () => {
    const { decideFor } = await netd();
    const w = row("allowlist:a.example,b.example:443");
    expect(decideFor(w, "a.example", 80)).toEqual({ allowed: true });
    expect(decideFor(w, "A.Example", 443)).toEqual({ allowed: true });
    expect(decideFor(w, "b.example", 443)).toEqual({ allowed: true });
    const refused = decideFor(w, "b.example", 80);
    expect(refused.allowed).toBe(false);
    expect((refused as { reason: string }).reason).toMatch(/allowlist/);
    expect(decideFor(w, "c.example", 443).allowed).toBe(false);
  });

  it("allows anything on egress, refuses everything on off", async () => {
    const { decideFor } = await netd();
    expect(decideFor(row("egress"), "anything.example", 1)).toEqual({ allowed: true });
    const off = decideFor(row("off"), "example.com", 443);
    expect(off).toEqual({ allowed: false, reason: expect.stringMatching(/off/) });
  });

  it("matches *.suffix on subdomains only", async () => {
    const { decideFor } = await netd();
    const w = row("allowlist:*.example.com");
    expect(decideFor(w, "a.example.com", 443).allowed).toBe(true);
    expect(decideFor(w, "b.a.example.com", 443).allowed).toBe(true);
    expect(decideFor(w, "example.com", 443).allowed).toBe(false);
    expect(decideFor(w, "badexample.com", 443).allowed).toBe(false);
    const approved = row("egress", ["*.internal"]);
    expect(decideFor(approved, "db.internal", 5432)).toEqual({ allowed: true, trustPrivate: true });
    expect(decideFor(approved, "internal", 5432)).toEqual({ allowed: true });
  });

  it("honours ports on approved entries", async () => {
    const { decideFor } = await netd();
    const w = row("allowlist:a.example", ["db.internal:5432", "[::1]:8080"]);
    expect(decideFor(w, "db.internal", 5432)).toEqual({ allowed: true, trustPrivate: true });
    expect(decideFor(w, "db.internal", 5433).allowed).toBe(false);
    expect(decideFor(w, "::1", 8080)).toEqual({ allowed: true, trustPrivate: true });
    expect(decideFor(w, "[::1]", 8080)).toEqual({ allowed: true, trustPrivate: true });
    expect(decideFor(w, "::1", 8081).allowed).toBe(false);
  });

  describe("importing it", () => {
    afterEach(() => vi.restoreAllMocks());
    it("starts nothing (main runs only as the entry point)", async () => {
      vi.resetModules();
      const exit = vi.spyOn(process, "exit").mockImplementation((() => undefined) as never);
      const write = vi.spyOn(process.stderr, "write");
      const sigterm = process.listenerCount("SIGTERM");
      const mod = await import("../../../src/core/netd.js");
      await new Promise((r) => setTimeout(r, 50));
      expect(typeof mod.runNetd).toBe("function");
      expect(exit).not.toHaveBeenCalled();
      expect(write.mock.calls.some(([c]) => String(c).includes("pyro-netd"))).toBe(false);
      expect(process.listenerCount("SIGTERM")).toBe(sigterm);
    });
    it("does run main as the entry point (the check above is not vacuous)", async () => {
      vi.resetModules();
      const exit = vi.spyOn(process, "exit").mockImplementation((() => undefined) as never);
      vi.spyOn(process.stderr, "write").mockImplementation(() => true);
      const argv1 = process.argv[1];
      process.argv[1] = fileURLToPath(new URL("../../../src/core/netd.ts", import.meta.url));
      try {
        await import("../../../src/core/netd.js");
        await vi.waitFor(() => expect(exit).toHaveBeenCalledWith(2));
      } finally {
        process.argv[1] = argv1 as string;
        vi.resetModules();
      }
    });
  });
});

describe("WorkspaceNetwork.env", () => {
  const deps = {
    dbPath: "/nonexistent/state.db",
    workspaceDir: (id: string) => `/nonexistent/${id}`,
    appDir: "/nonexistent",
  };
  const sandboxed = { name: "bwrap", executionMode: "guest_agent" } as unknown as WorkspaceBackend;

  it("points every proxy variable, in both cases, at the agent's port in a sandbox", async () => {
    const { WorkspaceNetwork } = await network();
    const net = new WorkspaceNetwork(deps);
    for (const policy of ["egress", "allowlist:a.example"]) {
      const env = await net.env(row(policy), sandboxed);
      const http = "http://127.0.0.1:3128";
      expect(env).toEqual({
        HTTP_PROXY: http,
        HTTPS_PROXY: http,
        ALL_PROXY: "socks5h://127.0.0.1:3128",
        NO_PROXY: "localhost,127.0.0.1,::1",
        http_proxy: http,
        https_proxy: http,
        all_proxy: "socks5h://127.0.0.1:3128",
        no_proxy: "localhost,127.0.0.1,::1",
      });
    }
  });

  it("gives nothing when the policy is off", async () => {
    const { WorkspaceNetwork } = await network();
    const net = new WorkspaceNetwork(deps);
    expect(await net.env(row("off"), sandboxed)).toEqual({});
    expect(await net.env(row("off", [], { published_ports: ports([0, 80]) }), sandboxed)).toEqual({});
  });

  it("gives nothing on host-compat while no helper reports a proxy port", async () => {
    const { WorkspaceNetwork } = await network();
    const net = new WorkspaceNetwork(deps);
    const host = { name: "host", executionMode: "host_compat" } as unknown as WorkspaceBackend;
    expect(await net.env(row("egress"), host)).toEqual({});
  });

  it("needs the helper for a policy or a published port only", async () => {
    const { WorkspaceNetwork } = await network();
    const net = new WorkspaceNetwork(deps);
    expect(net.needed(row("off"))).toBe(false);
    expect(net.needed(row("egress"))).toBe(true);
    expect(net.needed(row("off", [], { published_ports: ports([0, 80]) }))).toBe(true);
  });
});

describe("awaitReport (a starting helper's report)", () => {
  /**
   * A helper that writes its report and exits between two of the host's looks, in either
   * order of the host's reads: the world changes right after the first read of the report.
   */
  function helperExitingAfterFirstRead() {
    let reads = 0;
    let exited = false;
    return {
      read: async () => {
        reads++;
        const seen = exited ? { error: "port in use" } : null;
        exited = true;
        return seen;
      },
      alive: async () => !exited,
      reads: () => reads,
    };
  }

  it("finds the report of a helper that wrote it and exited between the host's looks", async () => {
    const { awaitReport } = await network();
    const world = helperExitingAfterFirstRead();
    expect(await awaitReport(world.read, world.alive, Date.now() + 5_000)).toEqual({ error: "port in use" });
    expect(world.reads()).toBe(2);
  });

  it("gives up on a helper gone without a report, and at the deadline", async () => {
    const { awaitReport } = await network();
    expect(
      await awaitReport(
        async () => null,
        async () => false,
        Date.now() + 5_000,
      ),
    ).toBeNull();
    const t = Date.now();
    expect(
      await awaitReport(
        async () => null,
        async () => true,
        Date.now() + 100,
      ),
    ).toBeNull();
    expect(Date.now() - t).toBeGreaterThanOrEqual(100);
  });
});
