import { isIP } from "node:net";
import { networkInterfaces } from "node:os";
import ipaddr from "ipaddr.js";

/**
 * What kind of address an IP is, from the point of view of a sandbox asking to reach it.
 *
 * The proxy checks every address a name resolves to, so a public name that points at
 * the host's loopback, the LAN or the cloud metadata service cannot be used to reach
 * them. Range tables come from ipaddr.js (kept up to date with the IANA registries);
 * this file only decides what each range means for us.
 */
export type AddressKind =
  | "public"
  | "loopback"
  | "private"
  | "link_local"
  | "cgnat"
  | "metadata"
  | "unspecified"
  | "multicast"
  | "reserved";

/**
 * Cloud instance-metadata endpoints. They hand out credentials, so they stay closed even
 * when private addresses are trusted. 100.100.100.200 (Alibaba) sits inside CGNAT space,
 * which `trustPrivate` would otherwise open.
 */
const METADATA = new Set(["169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254"]);

/**
 * Classifies an IP literal (IPv6 may be bracketed). Anything that is not a valid IP is
 * "reserved": unknown input is refused, never taken for public.
 */
export function classifyAddress(ip: string): AddressKind {
  const text = ip.startsWith("[") && ip.endsWith("]") ? ip.slice(1, -1) : ip;
  const family = isIP(text);
  // A zone id (fe80::1%eth0) names an interface, not a host anywhere we mean to go.
  if (family === 0 || text.includes("%")) return "reserved";
  if (family === 4) return classifyV4(ipaddr.IPv4.parse(text));
  return classifyV6(ipaddr.IPv6.parse(canonicalV6(text)));
}

/**
 * Rewrites IPv6 the WHATWG way first: ipaddr.js reads the IPv4-compatible `::10.0.0.1`
 * as IPv4-mapped `::ffff:10.0.0.1`, which is a different address from the one a dial reaches.
 */
function canonicalV6(text: string): string {
  return new URL(`http://[${text}]/`).hostname.slice(1, -1);
}

/** How long the machine's own addresses are cached (interfaces change rarely; a lookup costs a syscall). */
const OWN_TTL_MS = 5000;
let own: { at: number; set: Set<string> } | null = null;

/** One spelling per address: IPv6 in RFC 5952 form, IPv4-mapped IPv6 as its IPv4. */
function canonical(ip: string): string {
  const text = ip.startsWith("[") && ip.endsWith("]") ? ip.slice(1, -1) : ip;
  try {
    const a = ipaddr.parse(isIP(text) === 6 ? canonicalV6(text) : text);
    if (a.kind() === "ipv6" && (a as ipaddr.IPv6).isIPv4MappedAddress())
      return (a as ipaddr.IPv6).toIPv4Address().toString();
    return a.kind() === "ipv6" ? (a as ipaddr.IPv6).toRFC5952String() : a.toString();
  } catch {
    return text;
  }
}

/**
 * Whether `ip` is one of this machine's own addresses (any interface). Whatever range
 * such an address is in (a lab may give the host a public or documentation address),
 * reaching it reaches the host's services: it is refused like loopback.
 */
export function isOwnAddress(ip: string, interfaces = networkInterfaces): boolean {
  const now = Date.now();
  if (!own || now - own.at > OWN_TTL_MS || interfaces !== networkInterfaces) {
    const set = new Set<string>();
    for (const list of Object.values(interfaces()))
      for (const i of list ?? []) set.add(canonical(i.address.split("%")[0]!));
    if (interfaces !== networkInterfaces) return set.has(canonical(ip));
    own = { at: now, set };
  }
  return own.set.has(canonical(ip));
}

/** Kinds no policy opens: the host itself, link-local and metadata, and addresses that are not one host. */
export function isForbiddenAlways(kind: AddressKind): boolean {
  return (
    kind === "loopback" ||
    kind === "link_local" ||
    kind === "metadata" ||
    kind === "unspecified" ||
    kind === "multicast" ||
    kind === "reserved"
  );
}

/** Kinds reachable only when a human trusted private networks for the workspace. */
export function isPrivateish(kind: AddressKind): boolean {
  return kind === "private" || kind === "cgnat";
}

/**
 * The documentation networks (RFC 5737, RFC 3849) are not local, private or the host:
 * refusing them guards nothing, and labs and CI machines use them for stand-ins of
 * public services (this project's own CI resolves its package registry to one). They
 * count as public.
 */
const DOCUMENTATION_V4 = ["192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"].map((c) =>
  ipaddr.IPv4.parseCIDR(c),
);
const DOCUMENTATION_V6 = ipaddr.IPv6.parseCIDR("2001:db8::/32");

function classifyV4(addr: ipaddr.IPv4): AddressKind {
  if (METADATA.has(addr.toString())) return "metadata";
  if (DOCUMENTATION_V4.some((c) => addr.match(c))) return "public";
  switch (addr.range()) {
    case "unicast":
    case "as112":
    case "amt":
      return "public";
    case "loopback":
      return "loopback";
    case "private":
      return "private";
    case "carrierGradeNat":
      return "cgnat";
    case "linkLocal":
      return "link_local";
    case "unspecified":
      return "unspecified";
    case "multicast":
      return "multicast";
    default:
      // broadcast, 240/4, benchmarking nets: not a host we should dial
      return "reserved";
  }
}

function classifyV6(addr: ipaddr.IPv6): AddressKind {
  if (METADATA.has(addr.toRFC5952String())) return "metadata";
  if (addr.match(DOCUMENTATION_V6)) return "public";
  const range = addr.range();
  switch (range) {
    case "unspecified":
      return "unspecified";
    case "loopback":
      return "loopback";
    case "linkLocal":
      return "link_local";
    case "multicast":
      return "multicast";
    case "uniqueLocal":
      return "private";
    // IPv4-mapped, IPv4-translated and well-known NAT64 all carry an IPv4 address in
    // their low 32 bits and reach it: judge them by that address.
    case "ipv4Mapped":
    case "rfc6145":
      return classifyV4(embeddedV4(addr));
    default:
      break;
  }
  if (addr.match(NAT64_WELL_KNOWN)) return classifyV4(embeddedV4(addr));
  // Only 2000::/3 is global unicast; ::/96 (IPv4-compatible), 6to4, teredo, local NAT64
  // and the rest are refused rather than decoded.
  if (range === "unicast" || range === "as112v6" || range === "amt")
    return addr.match(GLOBAL_UNICAST) ? "public" : "reserved";
  return "reserved";
}

const NAT64_WELL_KNOWN = ipaddr.IPv6.parseCIDR("64:ff9b::/96");
const GLOBAL_UNICAST = ipaddr.IPv6.parseCIDR("2000::/3");

function embeddedV4(addr: ipaddr.IPv6): ipaddr.IPv4 {
  const bytes = addr.toByteArray();
  return new ipaddr.IPv4(bytes.slice(12, 16));
}
