import { isIPv4, isIPv6 } from "node:net";
import { PyroError } from "../errors.js";

/**
 * Network policy of a workspace, as text and as data.
 *
 * The text form is what a human types (`--network allowlist:pypi.org,*.github.com:443`)
 * and what the store keeps; `formatPolicy` gives one canonical spelling so two equal
 * policies compare equal as strings. Parsing is strict and fails closed: a policy that
 * cannot be read is an error, never "no restriction".
 */

/**
 * One allowlist entry. `host` is lower-case without a trailing dot: an exact name, an
 * IPv4 literal, a bare IPv6 literal (no brackets, canonical form), or `*.suffix`, which
 * matches any name that ends in `.suffix` but not `suffix` itself. `port: null` is any port.
 */
export type NetworkRule = { host: string; port: number | null };

export type ParsedPolicy = { kind: "off" } | { kind: "egress" } | { kind: "allowlist"; rules: NetworkRule[] };

/** Limits that keep a policy small enough to show in a status line and to store. */
export const MAX_POLICY_CHARS = 4096;
export const MAX_ALLOWLIST_ENTRIES = 256;

const POLICY_HINT =
  "Use off, egress, or allowlist:HOST[,HOST...] where HOST is a name, *.suffix, an IPv4 address " +
  "or [IPv6], each optionally with :PORT (1-65535); e.g. allowlist:pypi.org,*.github.com:443,[2001:db8::1]:8443";

const TARGET_HINT = "Use HOST[:PORT]: a name, *.suffix, an IPv4 address or [IPv6]; e.g. pypi.org:443";

/** A DNS label as we accept it; `_` appears in real names (SRV-style, some CDNs). */
const LABEL = /^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$/;

/** Reads a policy. Throws `invalid_argument` for anything that is not exactly one of the valid forms. */
export function parsePolicy(text: string): ParsedPolicy {
  if (text.length > MAX_POLICY_CHARS)
    throw invalid(`network policy is longer than ${MAX_POLICY_CHARS} characters`, POLICY_HINT);
  const trimmed = text.trim();
  const lower = trimmed.toLowerCase();
  if (lower === "off") return { kind: "off" };
  if (lower === "egress") return { kind: "egress" };
  if (!lower.startsWith("allowlist:")) throw invalid(`unknown network policy ${quote(trimmed)}`, POLICY_HINT);
  const body = trimmed.slice("allowlist:".length);
  if (body.trim() === "") throw invalid("network allowlist is empty", POLICY_HINT);
  const entries = body.split(",");
  if (entries.length > MAX_ALLOWLIST_ENTRIES)
    throw invalid(`network allowlist has more than ${MAX_ALLOWLIST_ENTRIES} entries`, POLICY_HINT);
  return { kind: "allowlist", rules: dedupe(entries.map((e) => parseEntry(e, POLICY_HINT))) };
}

/** Reads one `HOST[:PORT]` target (what `network approve` takes); same grammar as one allowlist entry. */
export function parseTarget(text: string): NetworkRule {
  if (text.length > 300) throw invalid("network target is too long", TARGET_HINT);
  return parseEntry(text, TARGET_HINT);
}

/** The canonical text of a policy: lower-case, duplicates removed, order kept. */
export function formatPolicy(p: ParsedPolicy): string {
  if (p.kind !== "allowlist") return p.kind;
  return `allowlist:${dedupe(p.rules).map(formatRule).join(",")}`;
}

/** One rule as text: `host`, `host:port`, `[v6]` or `[v6]:port`. */
export function formatRule(rule: NetworkRule): string {
  const host = isIPv6(rule.host) ? `[${rule.host}]` : rule.host;
  return rule.port === null ? host : `${host}:${rule.port}`;
}

/** Whether a rule covers a destination. Case-insensitive; one trailing dot and IPv6 brackets are ignored. */
export function ruleMatches(rule: NetworkRule, host: string, port: number): boolean {
  if (rule.port !== null && rule.port !== port) return false;
  const name = normalizeHost(host);
  if (name === null) return false;
  if (rule.host.startsWith("*.")) {
    const suffix = rule.host.slice(1);
    return name.length > suffix.length && name.endsWith(suffix);
  }
  return name === rule.host;
}

/** Whether a policy lets a connection to `host:port` through (by name; addresses are checked elsewhere). */
export function policyAllows(p: ParsedPolicy, host: string, port: number): boolean {
  if (p.kind === "off") return false;
  if (p.kind === "egress") return true;
  return p.rules.some((r) => ruleMatches(r, host, port));
}

/** Lower-case, one trailing dot dropped, IPv6 unbracketed and canonical; null for an empty name. */
function normalizeHost(host: string): string | null {
  let h = host.toLowerCase();
  if (h.startsWith("[") && h.endsWith("]")) h = h.slice(1, -1);
  if (h.endsWith(".")) h = h.slice(0, -1);
  if (h === "") return null;
  return isIPv6(h) && !h.includes("%") ? canonicalV6(h) : h;
}

function parseEntry(raw: string, hint: string): NetworkRule {
  const entry = raw.trim().toLowerCase();
  if (entry === "") throw invalid("network allowlist has an empty entry", hint);
  const { host, port } = splitHostPort(entry, hint);
  return { host: checkHost(host, entry, hint), port };
}

/** Splits `host[:port]` or `[v6][:port]`; a bare IPv6 literal needs brackets (its colons are ambiguous). */
function splitHostPort(entry: string, hint: string): { host: string; port: number | null } {
  if (entry.startsWith("[")) {
    const close = entry.indexOf("]");
    if (close < 0) throw invalid(`unclosed [ in network entry ${quote(entry)}`, hint);
    const v6 = entry.slice(1, close);
    if (!isIPv6(v6) || v6.includes("%")) throw invalid(`not an IPv6 address: ${quote(entry)}`, hint);
    const rest = entry.slice(close + 1);
    if (rest === "") return { host: canonicalV6(v6), port: null };
    if (!rest.startsWith(":")) throw invalid(`unexpected text after ] in ${quote(entry)}`, hint);
    return { host: canonicalV6(v6), port: parsePort(rest.slice(1), entry, hint) };
  }
  const colons = entry.split(":").length - 1;
  if (colons === 0) return { host: entry, port: null };
  if (colons > 1) throw invalid(`write an IPv6 address in brackets: ${quote(entry)}`, hint);
  const at = entry.indexOf(":");
  return { host: entry.slice(0, at), port: parsePort(entry.slice(at + 1), entry, hint) };
}

function parsePort(text: string, entry: string, hint: string): number {
  const port = /^[0-9]{1,5}$/.test(text) ? Number(text) : Number.NaN;
  if (!(port >= 1 && port <= 65535)) throw invalid(`port must be 1-65535 in ${quote(entry)}`, hint);
  return port;
}

/** Validates the host part; returns it without a trailing dot. IPv6 arrives here already canonical. */
function checkHost(host: string, entry: string, hint: string): string {
  if (isIPv6(host)) return host;
  const name = host.endsWith(".") ? host.slice(0, -1) : host;
  if (name === "*" || name === "*.")
    throw invalid(`a bare * is not allowed (use egress): ${quote(entry)}`, hint);
  const wildcard = name.startsWith("*.");
  const rest = wildcard ? name.slice(2) : name;
  if (rest.includes("*")) throw invalid(`* is only allowed as a leading *. in ${quote(entry)}`, hint);
  if (rest === "" || rest.length > 253) throw invalid(`bad host name in ${quote(entry)}`, hint);
  if (!rest.split(".").every((l) => LABEL.test(l)))
    throw invalid(`bad host name in ${quote(entry)} (letters, digits, - and _ only)`, hint);
  // All-numeric names are what resolvers read as (odd) IPv4 forms such as 127.1; allow only real IPv4.
  if (!wildcard && /^[0-9.]+$/.test(rest) && !isIPv4(rest))
    throw invalid(`not an IPv4 address: ${quote(entry)}`, hint);
  return name;
}

/** The WHATWG URL spelling of an IPv6 address (lower-case, compressed), as addresses.ts uses. */
function canonicalV6(v6: string): string {
  return new URL(`http://[${v6}]/`).hostname.slice(1, -1);
}

function dedupe(rules: NetworkRule[]): NetworkRule[] {
  const seen = new Set<string>();
  return rules.filter((r) => {
    const key = formatRule(r);
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
}

/** Quotes user text for a message, never more than ~100 characters of it. */
function quote(text: string): string {
  const clipped = text.length > 100 ? `${text.slice(0, 100)}…` : text;
  return JSON.stringify(clipped);
}

function invalid(message: string, hint: string): PyroError {
  return new PyroError("invalid_argument", message, hint);
}
