import { request } from "node:http";
import type { BackendProbe } from "../backend.js";
import { type EngineInfo, hostSupport, readMountinfo, rootQuotaOf } from "./storage-quota.js";

/** Where to find a Docker-compatible engine: DOCKER_HOST, else the usual sockets. */
export function engineEndpoints(env: NodeJS.ProcessEnv): string[] {
  if (env.DOCKER_HOST) return [env.DOCKER_HOST];
  return ["unix:///var/run/docker.sock", "unix:///run/podman/podman.sock"];
}

/** GET a path on a Docker engine endpoint (unix:// or tcp://); resolves body text. */
export function engineGet(
  endpoint: string,
  path: string,
  timeoutMs: number,
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const opts: import("node:http").RequestOptions = { path, method: "GET", timeout: timeoutMs };
    if (endpoint.startsWith("unix://")) opts.socketPath = endpoint.slice("unix://".length);
    else {
      const u = new URL(endpoint.replace(/^tcp:/, "http:"));
      opts.host = u.hostname;
      opts.port = u.port;
    }
    const req = request(opts, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => {
        body += c;
      });
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on("timeout", () => req.destroy(new Error("timed out")));
    req.on("error", reject);
    req.end();
  });
}

/** Whether workspaces on the engine get a disk limit (docker/disk-limit.ts), as doctor says it. */
async function diskLimitLine(endpoint: string, timeoutMs: number): Promise<string> {
  let s = hostSupport(endpoint);
  if (!s) {
    const info = await engineGet(endpoint, "/info", timeoutMs).catch(() => null);
    let parsed: EngineInfo = {};
    try {
      parsed = JSON.parse(info?.body ?? "{}") as EngineInfo;
    } catch {
      // an engine that answers no JSON: an unknown driver
    }
    s = rootQuotaOf(parsed, readMountinfo());
  }
  return s.ok ? `yes (storage driver ${s.driver}, /workspace on an image)` : `none: ${s.message}`;
}

/** Proves a Docker engine by pinging its API socket. */
export const dockerProbe: BackendProbe = {
  name: "docker",
  isolation: "containers (Docker Engine API)",
  async probe(ctx) {
    const failures: string[] = [];
    for (const endpoint of engineEndpoints(ctx.env)) {
      try {
        const ping = await engineGet(endpoint, "/_ping", ctx.timeoutMs);
        if (ping.status !== 200) {
          failures.push(`${endpoint}: HTTP ${ping.status}`);
          continue;
        }
        const v = await engineGet(endpoint, "/version", ctx.timeoutMs);
        let version: string | null = null;
        try {
          version = (JSON.parse(v.body) as { Version?: string }).Version ?? null;
        } catch {
          // keep null
        }
        return {
          available: true,
          version,
          reason: "used only when asked for (--backend docker)",
          opt_in: true,
          details: { endpoint, disk_limit: await diskLimitLine(endpoint, ctx.timeoutMs) },
        };
      } catch (err) {
        failures.push(`${endpoint}: ${(err as Error).message}`);
      }
    }
    return {
      available: false,
      version: null,
      reason: `no Docker engine answers (${failures.join("; ")}); start dockerd or set DOCKER_HOST`,
      opt_in: true,
      details: {},
    };
  },
};
