import { PyroError } from "../../errors.js";

/** A parsed OCI/Docker image reference, normalized the way Docker normalizes it. */
export interface ImageReference {
  /** Registry host as written (with port), `docker.io` for Docker Hub. */
  registry: string;
  /** Repository path, `library/` added for single-name Docker Hub images. */
  repository: string;
  tag: string | null;
  digest: string | null;
}

const DOCKER_HUB = "docker.io";
/** Docker Hub's API host: `docker.io` is only its name in references. */
const DOCKER_HUB_API = "registry-1.docker.io";
const PATH_COMPONENT = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/;
const TAG = /^[\w][\w.-]{0,127}$/;
const DIGEST = /^sha256:[a-f0-9]{64}$/;

/**
 * Parses `[host[:port]/]path[:tag][@sha256:...]`. The first component is a registry
 * host when it contains a `.` or a `:` or is `localhost` (Docker's rule); otherwise the
 * image is on Docker Hub. No tag and no digest means `latest`.
 */
export function parseReference(input: string): ImageReference {
  const bad = (why: string) =>
    new PyroError(
      "invalid_argument",
      `'${input}' is not an image reference: ${why}`,
      "write it as [REGISTRY/]PATH[:TAG][@sha256:DIGEST], e.g. docker.io/library/python:3.12",
    );
  if (input.length === 0 || input.length > 512 || /\s/.test(input))
    throw bad("empty, too long or has spaces");
  let rest = input;
  let digest: string | null = null;
  const at = rest.indexOf("@");
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!DIGEST.test(digest)) throw bad("the digest must be sha256: and 64 hex digits");
  }
  let registry = DOCKER_HUB;
  const slash = rest.indexOf("/");
  if (slash > 0) {
    const first = rest.slice(0, slash);
    if (first.includes(".") || first.includes(":") || first === "localhost") {
      registry = first;
      rest = rest.slice(slash + 1);
    }
  }
  if (!/^[A-Za-z0-9.-]+(?::\d{1,5})?$|^\[[0-9a-fA-F:]+\](?::\d{1,5})?$/.test(registry))
    throw bad("bad registry host");
  let tag: string | null = null;
  const colon = rest.lastIndexOf(":");
  if (colon > rest.lastIndexOf("/")) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
    if (!TAG.test(tag)) throw bad("bad tag");
  }
  if (registry === "index.docker.io") registry = DOCKER_HUB;
  if (registry === DOCKER_HUB && !rest.includes("/")) rest = `library/${rest}`;
  const parts = rest.split("/");
  if (parts.length === 0 || parts.some((p) => !PATH_COMPONENT.test(p))) throw bad("bad repository path");
  if (tag === null && digest === null) tag = "latest";
  return { registry, repository: rest, tag, digest };
}

/** The canonical string of a reference: `host/path:tag`, `host/path@digest` or both. */
export function formatReference(r: ImageReference): string {
  return `${r.registry}/${r.repository}${r.tag !== null ? `:${r.tag}` : ""}${r.digest !== null ? `@${r.digest}` : ""}`;
}

/** The host that answers the registry API for a reference's registry name. */
export function apiHost(registry: string): string {
  return registry === DOCKER_HUB ? DOCKER_HUB_API : registry;
}

/** True for registries on this machine's loopback (the only ones plain HTTP is allowed for). */
export function isLoopbackRegistry(registry: string): boolean {
  const host = registry.startsWith("[") ? registry.slice(1, registry.indexOf("]")) : registry.split(":")[0];
  return host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host ?? "");
}

/**
 * Whether a name looks like an image reference rather than a misspelt official
 * environment: a registry host, a path, a tag or a digest.
 */
export function looksLikeReference(name: string): boolean {
  try {
    parseReference(name);
    return true;
  } catch {
    return false;
  }
}
