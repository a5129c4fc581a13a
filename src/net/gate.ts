import { promises as dns } from "node:dns";
import { isIP, connect as netConnect, type Socket } from "node:net";
import {
  type AddressKind,
  classifyAddress,
  isForbiddenAlways,
  isOwnAddress,
  isPrivateish,
} from "./addresses.js";

/**
 * The one place a proxied connection is decided and dialled, whatever protocol asked.
 *
 * Order matters: the policy is asked by name first; then the name is resolved once,
 * every address it resolves to is classified, and only then one of those checked
 * addresses is dialled by IP. The dial never resolves again, so a name cannot answer
 * "public" to the check and "127.0.0.1" to the connect (DNS rebinding).
 */

export type Destination = { host: string; port: number };

export type Decision = { allowed: true; trustPrivate?: boolean } | { allowed: false; reason: string };

export interface GateOptions {
  decide(dest: Destination): Decision | Promise<Decision>;
  resolve?: (host: string) => Promise<string[]>;
  testHosts?: ReadonlyMap<string, string>;
  connectTimeoutMs?: number;
  /** Whether an address is this machine's own (default: its interfaces, isOwnAddress). Tests replace it. */
  ownAddress?: (ip: string) => boolean;
}

/** Why a connection did not open; each protocol maps these to its own reply. */
export type Refusal = "blocked" | "unresolvable" | "unreachable" | "bad_target";

export type Opened =
  | { ok: true; socket: Socket; address: string }
  | { ok: false; refusal: Refusal; reason: string };

export const DEFAULT_CONNECT_TIMEOUT_MS = 10_000;

const LABEL = /^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$/;

/**
 * Canonical host of a requested destination: lower-case, no brackets, no trailing dot.
 * Null when it is neither an IP literal nor a plausible DNS name; all-digit names are
 * refused because resolvers read them as IPv4 in odd notations (2130706433 is 127.0.0.1).
 */
export function normalizeDestHost(raw: string): string | null {
  let h = raw.toLowerCase();
  if (h.startsWith("[") && h.endsWith("]")) {
    h = h.slice(1, -1);
    return isIP(h) === 6 && !h.includes("%") ? h : null;
  }
  if (h.endsWith(".")) h = h.slice(0, -1);
  if (isIP(h) === 4 || (isIP(h) === 6 && !h.includes("%"))) return h;
  if (h === "" || h.length > 253 || /^[0-9.]+$/.test(h)) return null;
  return h.split(".").every((l) => LABEL.test(l)) ? h : null;
}

/** Decides, resolves, checks and dials one destination. Never throws. */
export async function openDestination(
  dest: Destination,
  options: GateOptions,
  track: (s: Socket) => void,
): Promise<Opened> {
  const host = normalizeDestHost(dest.host);
  if (host === null || !(Number.isInteger(dest.port) && dest.port >= 1 && dest.port <= 65535))
    return { ok: false, refusal: "bad_target", reason: "not a valid host and port" };
  const target = { host, port: dest.port };

  let decision: Decision;
  try {
    decision = await options.decide(target);
  } catch {
    // a policy that cannot be evaluated closes the door
    return { ok: false, refusal: "blocked", reason: "the network policy could not be evaluated" };
  }
  if (!decision.allowed) return { ok: false, refusal: "blocked", reason: decision.reason };

  const timeoutMs = options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS;
  const picked = await pickAddress(host, options, decision.trustPrivate === true, timeoutMs);
  if (!picked.ok) return picked;
  try {
    const socket = await dial(picked.address, dest.port, timeoutMs, track);
    return { ok: true, socket, address: picked.address };
  } catch (err) {
    return { ok: false, refusal: "unreachable", reason: describe(err) };
  }
}

type Picked = { ok: true; address: string } | { ok: false; refusal: Refusal; reason: string };

/** Resolves once and checks every address; returns the first one if all pass. */
async function pickAddress(
  host: string,
  options: GateOptions,
  trustPrivate: boolean,
  timeoutMs: number,
): Promise<Picked> {
  // Test-only mapping: it bypasses the address check, so it must come from code, never from config or env.
  const pinned = options.testHosts?.get(host);
  if (pinned !== undefined) return { ok: true, address: pinned };

  let addresses: string[];
  if (isIP(host) !== 0) addresses = [host];
  else {
    try {
      addresses = await withTimeout((options.resolve ?? defaultResolve)(host), timeoutMs, "lookup timed out");
    } catch (err) {
      return { ok: false, refusal: "unresolvable", reason: `cannot resolve ${host}: ${describe(err)}` };
    }
    if (addresses.length === 0)
      return { ok: false, refusal: "unresolvable", reason: `${host} has no address` };
  }
  const own = options.ownAddress ?? isOwnAddress;
  for (const address of addresses) {
    const kind = classifyAddress(address);
    if (isForbiddenAlways(kind))
      return { ok: false, refusal: "blocked", reason: addressReason(host, address, kind) };
    // The machine's own addresses, whatever their range, reach the host's services.
    if (own(address))
      return {
        ok: false,
        refusal: "blocked",
        reason: `${host === address ? address : `${host} resolves to ${address}`}, an address of this machine (never reachable)`,
      };
    if (isPrivateish(kind) && !trustPrivate)
      return { ok: false, refusal: "blocked", reason: addressReason(host, address, kind) };
  }
  return { ok: true, address: addresses[0]! };
}

function addressReason(host: string, address: string, kind: AddressKind): string {
  const what = host === address ? address : `${host} resolves to ${address}`;
  const why = isPrivateish(kind) ? "private networks are not trusted for this workspace" : "never reachable";
  return `${what}, a ${kind.replace("_", "-")} address (${why})`;
}

async function defaultResolve(host: string): Promise<string[]> {
  const found = await dns.lookup(host, { all: true, verbatim: true });
  return found.map((a) => a.address);
}

/** Connects to an IP literal; `net.connect` does no lookup for one. */
function dial(ip: string, port: number, timeoutMs: number, track: (s: Socket) => void): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = netConnect({ host: ip, port });
    track(socket);
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error("connect timed out"));
    }, timeoutMs);
    const onError = (err: Error) => {
      clearTimeout(timer);
      socket.destroy();
      reject(err);
    };
    socket.once("error", onError);
    socket.once("connect", () => {
      clearTimeout(timer);
      socket.removeListener("error", onError);
      resolve(socket);
    });
  });
}

function withTimeout<T>(p: Promise<T>, ms: number, message: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(message)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

function describe(err: unknown): string {
  const e = err as NodeJS.ErrnoException;
  return (e?.code ?? e?.message ?? String(err)).slice(0, 120);
}
