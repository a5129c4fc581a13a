import { readFileSync } from "node:fs";
import { request } from "node:http";
import type { BackendProbe } from "../backend.js";

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

// What an engine can limit (docker/disk-limit.ts applies it): here, so doctor's probe
// decides it without loading the backend.

/** The parts of `GET /info` that say what the storage driver can limit. */
export interface EngineInfo {
  Driver?: string;
  DriverStatus?: [string, string][] | null;
  DockerRootDir?: string;
  SecurityOptions?: string[] | null;
}

/** Whether workspaces on an engine get a disk limit, and if not, why. */
export type DiskSupport =
  | { ok: true; driver: string; countsImage: boolean }
  | { ok: false; message: string; hint: string };

const HINT =
  "run the engine with the btrfs or zfs storage driver, or overlay2 on xfs mounted with pquota (scripts/dockerd-test starts one on btrfs); or use --backend bwrap";

/**
 * What the engine's storage driver can do, from its `/info` and this host's mount table
 * (an xfs data root's project quotas show only in its mount options).
 */
export function rootQuotaOf(info: EngineInfo, mountinfo: string): DiskSupport {
  const driver = info.Driver ?? "unknown";
  if ((info.SecurityOptions ?? []).some((o) => o.includes("name=rootless")))
    return { ok: false, message: "a rootless engine does not see this host's mounts", hint: HINT };
  if (driver === "btrfs") return { ok: true, driver, countsImage: true };
  if (driver === "zfs") return { ok: true, driver, countsImage: false };
  const backing = (info.DriverStatus ?? []).find(([k]) => k === "Backing Filesystem")?.[1] ?? "unknown";
  if ((driver === "overlay2" || driver === "vfs") && backing === "xfs" && info.DockerRootDir) {
    const m = mountOf(mountinfo, info.DockerRootDir);
    if (m && m.fstype === "xfs" && /(^|,)(prjquota|pquota|pqnoenforce)(,|$)/.test(m.options))
      return { ok: true, driver, countsImage: false };
  }
  return {
    ok: false,
    message: `the engine's storage driver (${driver} on ${backing}) cannot limit a container's writable layer`,
    hint: HINT,
  };
}

/** The mount a path lives on (the longest mount point that contains it), from mountinfo text. */
function mountOf(mountinfo: string, path: string): { fstype: string; options: string } | null {
  let best: { point: string; fstype: string; options: string } | null = null;
  for (const line of mountinfo.split("\n")) {
    const [left, right] = line.split(" - ");
    const point = left?.split(" ")[4];
    const [fstype, , superOpts] = right?.split(" ") ?? [];
    if (!point || !fstype) continue;
    const inside = path === point || path.startsWith(point.endsWith("/") ? point : `${point}/`);
    if (inside && (!best || point.length >= best.point.length))
      best = { point, fstype, options: `${left?.split(" ")[5] ?? ""},${superOpts ?? ""}` };
  }
  return best;
}

/** What this process and the endpoint allow, before the engine is asked (null: both fine). */
export function hostSupport(endpoint: string): DiskSupport | null {
  if (process.getuid?.() !== 0)
    return { ok: false, message: "mounting /workspace's disk image needs root", hint: HINT };
  if (!endpoint.startsWith("unix://"))
    return { ok: false, message: `the engine at ${endpoint} is not on this host's filesystem`, hint: HINT };
  return null;
}

export function readMountinfo(): string {
  try {
    return readFileSync("/proc/self/mountinfo", "utf8");
  } catch {
    return ""; // no mount table: only btrfs and zfs are recognised
  }
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
