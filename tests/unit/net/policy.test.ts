import { describe, expect, it } from "vitest";
import { PyroError } from "../../../src/errors.js";
import {
  formatPolicy,
  type ParsedPolicy,
  parsePolicy,
  parseTarget,
  policyAllows,
  ruleMatches,
} from "../../../src/net/policy.js";

function rejection(fn: () => unknown): PyroError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(PyroError);
    return err as PyroError;
  }
  throw new Error("expected a rejection");
}

describe("parsePolicy", () => {
  it("reads off and egress, in any case", () => {
    expect(parsePolicy("off")).toEqual({ kind: "off" });
    expect(parsePolicy(" EGRESS ")).toEqual({ kind: "egress" });
  });

  it("reads names, wildcards, IPv4, bracketed IPv6 and ports", () => {
    expect(parsePolicy("allowlist:PyPI.org, *.GitHub.com:443,10.0.0.5,[2001:DB8:0::1]:8443,host.")).toEqual({
      kind: "allowlist",
      rules: [
        { host: "pypi.org", port: null },
        { host: "*.github.com", port: 443 },
        { host: "10.0.0.5", port: null },
        { host: "2001:db8::1", port: 8443 },
        { host: "host", port: null },
      ],
    });
  });

  it("formats canonically: lower-case, duplicates removed, IPv6 in brackets", () => {
    const p = parsePolicy("Allowlist:a.example:80,A.EXAMPLE:80,a.example,[::1]");
    expect(formatPolicy(p)).toBe("allowlist:a.example:80,a.example,[::1]");
    expect(parsePolicy(formatPolicy(p))).toEqual(p);
    expect(formatPolicy({ kind: "off" })).toBe("off");
    expect(formatPolicy({ kind: "egress" })).toBe("egress");
  });

  it.each([
    ["", "unknown"],
    ["on", "unknown"],
    ["allowlist:", "empty"],
    ["allowlist:  ", "empty"],
    ["allowlist:a.com,,b.com", "empty entry"],
    ["allowlist:a.com,", "empty entry"],
    ["allowlist:a b.com", "bad host"],
    ["allowlist:a/b", "bad host"],
    ["allowlist:exa$mple.com", "bad host"],
    ["allowlist:a.com:0", "port"],
    ["allowlist:a.com:65536", "port"],
    ["allowlist:a.com:http", "port"],
    ["allowlist:a.com:", "port"],
    ["allowlist:*", "bare *"],
    ["allowlist:*:443", "bare *"],
    ["allowlist:a.*.com", "leading"],
    ["allowlist:*a.com", "leading"],
    ["allowlist:a*", "leading"],
    ["allowlist:2001:db8::1", "brackets"],
    ["allowlist:[2001:db8::1", "unclosed"],
    ["allowlist:[a.com]", "IPv6"],
    ["allowlist:[fe80::1%eth0]", "IPv6"],
    ["allowlist:[::1]x", "after ]"],
    ["allowlist:127.1", "IPv4"],
    ["allowlist:2130706433", "IPv4"],
    ["allowlist:-a.com", "bad host"],
  ])("rejects %j (%s)", (text, fragment) => {
    const err = rejection(() => parsePolicy(text));
    expect(err.code).toBe("invalid_argument");
    expect(err.message).toContain(fragment);
    expect(err.hint).toContain("allowlist:");
  });

  it("rejects more than 256 entries and more than 4096 characters", () => {
    const many = Array.from({ length: 257 }, (_, i) => `h${i}.io`).join(",");
    expect(rejection(() => parsePolicy(`allowlist:${many}`)).message).toContain("256");
    expect(parsePolicy(`allowlist:${many.split(",").slice(0, 256).join(",")}`).kind).toBe("allowlist");
    expect(rejection(() => parsePolicy(`allowlist:${"a".repeat(5000)}`)).message).toContain("4096");
  });

  it("never echoes more than about 100 characters of the input", () => {
    const long = `allowlist:${"x".repeat(250)}$`;
    const err = rejection(() => parsePolicy(long));
    expect(err.message.length).toBeLessThan(200);
    expect(rejection(() => parsePolicy("q".repeat(3000))).message.length).toBeLessThan(200);
  });
});

describe("parseTarget", () => {
  it("reads one entry with the allowlist grammar", () => {
    expect(parseTarget("Example.com:443")).toEqual({ host: "example.com", port: 443 });
    expect(parseTarget("*.example.com")).toEqual({ host: "*.example.com", port: null });
    expect(parseTarget("[::1]:22")).toEqual({ host: "::1", port: 22 });
  });

  it("rejects what an allowlist entry rejects", () => {
    for (const bad of ["", "*", "a.com:0", "a,b", "a.com:1:2"])
      expect(rejection(() => parseTarget(bad)).code).toBe("invalid_argument");
  });
});

describe("ruleMatches and policyAllows", () => {
  it("matches exact names case-insensitively, ignoring one trailing dot", () => {
    const rule = { host: "pypi.org", port: null };
    expect(ruleMatches(rule, "PyPI.org", 443)).toBe(true);
    expect(ruleMatches(rule, "pypi.org.", 80)).toBe(true);
    expect(ruleMatches(rule, "pypi.org..", 80)).toBe(false);
    expect(ruleMatches(rule, "files.pypi.org", 443)).toBe(false);
    expect(ruleMatches(rule, "evilpypi.org", 443)).toBe(false);
  });

  it("matches a wildcard below the suffix but not the suffix itself", () => {
    const rule = { host: "*.github.com", port: 443 };
    expect(ruleMatches(rule, "api.github.com", 443)).toBe(true);
    expect(ruleMatches(rule, "a.b.GITHUB.com.", 443)).toBe(true);
    expect(ruleMatches(rule, "github.com", 443)).toBe(false);
    expect(ruleMatches(rule, "evilgithub.com", 443)).toBe(false);
    expect(ruleMatches(rule, "api.github.com", 80)).toBe(false);
  });

  it("matches IPv6 literals in any spelling", () => {
    const rule = parseTarget("[2001:db8::1]:443");
    expect(ruleMatches(rule, "[2001:DB8:0:0::1]", 443)).toBe(true);
    expect(ruleMatches(rule, "2001:db8::1", 443)).toBe(true);
  });

  it("off allows nothing, egress everything, an allowlist what a rule matches", () => {
    const list: ParsedPolicy = parsePolicy("allowlist:a.io:443,*.b.io");
    expect(policyAllows({ kind: "off" }, "a.io", 443)).toBe(false);
    expect(policyAllows({ kind: "egress" }, "a.io", 443)).toBe(true);
    expect(policyAllows(list, "a.io", 443)).toBe(true);
    expect(policyAllows(list, "a.io", 80)).toBe(false);
    expect(policyAllows(list, "x.b.io", 22)).toBe(true);
    expect(policyAllows(list, "c.io", 443)).toBe(false);
    expect(policyAllows(list, "", 443)).toBe(false);
  });
});
