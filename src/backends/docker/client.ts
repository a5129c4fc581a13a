/**
 * Reaching a Docker-compatible engine: which endpoint (DOCKER_HOST or the usual sockets),
 * a dockerode client for it, per-call deadlines, and the mapping of engine errors to
 * PyroError codes.
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type Docker from "dockerode";
import { PyroError } from "../../errors.js";
import { engineEndpoints } from "./probe.js";

/** Deadlines of engine calls. Imports and waits get their own. */
export const CALL_MS = 30_000;

/**
 * The endpoint to use: DOCKER_HOST when set, else the first default socket that exists
 * (Docker's, then rootful Podman's).
 */
export function resolveEndpoint(env: NodeJS.ProcessEnv): string {
  const candidates = engineEndpoints(env);
  if (env.DOCKER_HOST) return env.DOCKER_HOST;
  const found = candidates.find((e) => existsSync(e.slice("unix://".length)));
  if (!found) {
    throw new PyroError(
      "backend_unavailable",
      `no Docker engine socket found (${candidates.join(", ")})`,
      "start dockerd (or `podman system service`), or set DOCKER_HOST",
    );
  }
  return found;
}

/** dockerode options for an endpoint; every field is explicit so DOCKER_HOST in this process never leaks in. */
export function clientOptions(endpoint: string, env: NodeJS.ProcessEnv = {}): Docker.DockerOptions {
  if (endpoint.startsWith("unix://")) {
    return {
      socketPath: endpoint.slice("unix://".length),
      host: undefined,
      port: undefined,
      protocol: "http",
    } as Docker.DockerOptions;
  }
  let url: URL;
  try {
    url = new URL(endpoint.includes("://") ? endpoint : `tcp://${endpoint}`);
  } catch {
    throw new PyroError("invalid_argument", `cannot parse the Docker endpoint '${endpoint}'`);
  }
  if (url.protocol !== "tcp:" && url.protocol !== "http:" && url.protocol !== "https:") {
    throw new PyroError(
      "backend_unavailable",
      `Docker endpoints of the form ${url.protocol}// are not supported`,
      "use unix:///path/to/docker.sock or tcp://host:port",
    );
  }
  const tls = url.protocol === "https:" || env.DOCKER_TLS_VERIFY === "1" || url.port === "2376";
  const opts: Docker.DockerOptions = {
    socketPath: undefined,
    host: url.hostname,
    port: url.port || (tls ? 2376 : 2375),
    protocol: tls ? "https" : "http",
  };
  if (tls && env.DOCKER_CERT_PATH) {
    opts.ca = readFileSync(join(env.DOCKER_CERT_PATH, "ca.pem"));
    opts.cert = readFileSync(join(env.DOCKER_CERT_PATH, "cert.pem"));
    opts.key = readFileSync(join(env.DOCKER_CERT_PATH, "key.pem"));
  }
  return opts;
}

/** A per-call deadline for dockerode's `abortSignal` option. */
export function deadline(ms = CALL_MS, signal?: AbortSignal): { abortSignal: AbortSignal } {
  const t = AbortSignal.timeout(ms);
  return { abortSignal: signal ? AbortSignal.any([t, signal]) : t };
}

/** HTTP status of a dockerode error, if it is one. */
export function statusOf(err: unknown): number | undefined {
  const s = (err as { statusCode?: unknown } | null)?.statusCode;
  return typeof s === "number" ? s : undefined;
}

/** The engine's own message of a dockerode error ("(HTTP code 404) no such container - ..."). */
export function engineMessage(err: unknown): string {
  const json = (err as { json?: { message?: unknown } } | null)?.json;
  if (json && typeof json.message === "string") return json.message;
  return (err as Error)?.message ?? String(err);
}

/** Maps an engine failure to a PyroError, naming what was being done. */
export function engineError(err: unknown, what: string, endpoint: string): PyroError {
  if (err instanceof PyroError) return err;
  const name = (err as { name?: string } | null)?.name;
  const code = (err as NodeJS.ErrnoException | null)?.code;
  if (name === "TimeoutError" || name === "AbortError") {
    return new PyroError("timeout", `${what}: the Docker engine at ${endpoint} did not answer in time`);
  }
  if (code === "ENOENT" || code === "ECONNREFUSED" || code === "EACCES" || code === "EPERM") {
    return new PyroError(
      code === "EACCES" || code === "EPERM" ? "permission_denied" : "backend_unavailable",
      `${what}: cannot reach the Docker engine at ${endpoint} (${code})`,
      code === "EACCES"
        ? "join the docker group or use a socket you can open"
        : "start the engine or set DOCKER_HOST",
    );
  }
  return new PyroError("backend_unavailable", `${what}: ${engineMessage(err)}`, undefined, { cause: err });
}

/** Runs an engine call, treating "not found" (and "not running" for kill/stop) as done. */
export async function ignoreGone<T>(p: Promise<T>, alsoOk: number[] = []): Promise<T | undefined> {
  try {
    return await p;
  } catch (err) {
    const s = statusOf(err);
    if (s === 404 || (s !== undefined && alsoOk.includes(s))) return undefined;
    throw err;
  }
}

/** One dockerode client per endpoint, shared by a backend instance. */
export class EngineClients {
  private readonly clients = new Map<string, Docker>();

  constructor(private readonly env: NodeJS.ProcessEnv) {}

  /** The endpoint this process would use for a new sandbox. */
  defaultEndpoint(): string {
    return resolveEndpoint(this.env);
  }

  /**
   * The client of an endpoint. dockerode (with ssh2, gRPC and protobufjs: ~200 modules,
   * a fifth of a second) is loaded on first use, not by every process that imports the
   * backend list.
   */
  async get(endpoint: string): Promise<Docker> {
    let c = this.clients.get(endpoint);
    if (!c) {
      const { default: DockerClient } = await import("dockerode");
      c = new DockerClient(clientOptions(endpoint, this.env));
      this.clients.set(endpoint, c);
    }
    return c;
  }
}

/**
 * Bounds a call that cannot take an AbortSignal (a hijacked connection would stay tied to
 * it); a result that arrives too late is handed to `onLate` to be disposed of.
 */
export function withTimeout<T>(p: Promise<T>, ms: number, onLate: (value: T) => void): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let done = false;
    const timer = setTimeout(() => {
      done = true;
      reject(new PyroError("timeout", `the Docker engine did not answer within ${ms} ms`));
    }, ms);
    p.then(
      (v) => {
        if (done) onLate(v);
        else {
          done = true;
          clearTimeout(timer);
          resolve(v);
        }
      },
      (e) => {
        if (!done) {
          done = true;
          clearTimeout(timer);
          reject(e);
        }
      },
    );
  });
}
