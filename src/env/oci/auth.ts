import { readFile } from "node:fs/promises";
import { homedir } from "node:os";
import { join } from "node:path";
import { PyroError } from "../../errors.js";

/** A user name and password (or token) for one registry; never logged nor stored. */
export interface Credentials {
  username: string;
  password: string;
}

/**
 * Finds credentials for a registry host. Order: `PYRO_REGISTRY_AUTH`, then the Docker
 * client's `config.json` (`$DOCKER_CONFIG/config.json`, default `~/.docker/config.json`),
 * its `auths` entries (`auth` base64 `user:password`, or `username` and `password`).
 * Credential helpers (`credsStore`, `credHelpers`) are not run: pyro does not execute
 * host programs named by a config file.
 *
 * `PYRO_REGISTRY_AUTH` is `HOST=USER:PASSWORD` entries separated by commas (a bare
 * `USER:PASSWORD` applies to every registry).
 */
export async function findCredentials(
  registry: string,
  env: NodeJS.ProcessEnv,
  registryAuth: string | undefined,
): Promise<Credentials | null> {
  const fromEnv = registryAuth;
  if (fromEnv) {
    for (const item of fromEnv.split(",")) {
      const eq = item.indexOf("=");
      const left = eq >= 0 ? item.slice(0, eq).trim() : "";
      const host = HOST.test(left) && item.slice(eq + 1).includes(":") ? left : null;
      const pair = host === null ? item : item.slice(eq + 1);
      const c = splitPair(pair);
      if (!c) {
        throw new PyroError(
          "invalid_argument",
          "PYRO_REGISTRY_AUTH is malformed",
          "write HOST=USER:PASSWORD[,HOST=USER:PASSWORD...] or USER:PASSWORD",
        );
      }
      if (host === null || sameRegistry(host, registry)) return c;
    }
  }
  const dir = env.DOCKER_CONFIG ?? join(env.HOME ?? homedir(), ".docker");
  let text: string;
  try {
    text = await readFile(join(dir, "config.json"), "utf8");
  } catch {
    return null;
  }
  let config: { auths?: Record<string, { auth?: string; username?: string; password?: string }> };
  try {
    config = JSON.parse(text);
  } catch {
    throw new PyroError(
      "invalid_argument",
      `${join(dir, "config.json")} is not valid JSON`,
      "fix or remove it",
    );
  }
  for (const [key, entry] of Object.entries(config.auths ?? {})) {
    if (!sameRegistry(key, registry)) continue;
    if (entry.auth) {
      const c = splitPair(Buffer.from(entry.auth, "base64").toString("utf8"));
      if (c) return c;
    }
    if (entry.username && entry.password) return { username: entry.username, password: entry.password };
  }
  return null;
}

const HOST = /^(?:[A-Za-z0-9.-]+|\[[0-9a-fA-F:]+\])(?::\d{1,5})?$/;

function splitPair(pair: string): Credentials | null {
  const i = pair.indexOf(":");
  if (i <= 0) return null;
  return { username: pair.slice(0, i), password: pair.slice(i + 1) };
}

/** Docker config keys may be URLs (`https://index.docker.io/v1/`) or bare hosts. */
function sameRegistry(key: string, registry: string): boolean {
  const host = key.replace(/^https?:\/\//, "").split("/")[0] ?? "";
  const norm = (h: string) => (h === "index.docker.io" || h === "registry-1.docker.io" ? "docker.io" : h);
  return norm(host) === norm(registry);
}

/** One `WWW-Authenticate` challenge: its scheme and parameters. */
export interface Challenge {
  scheme: string;
  params: Record<string, string>;
}

/** Parses `Bearer realm="...",service="...",scope="..."` (quoted or token values). */
export function parseChallenge(header: string): Challenge | null {
  const m = /^\s*(\w+)\s*(.*)$/.exec(header);
  if (!m) return null;
  const params: Record<string, string> = {};
  const re = /(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))\s*,?/g;
  for (const p of (m[2] ?? "").matchAll(re)) params[(p[1] ?? "").toLowerCase()] = p[2] ?? p[3] ?? "";
  return { scheme: (m[1] ?? "").toLowerCase(), params };
}
