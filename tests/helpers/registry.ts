/**
 * A real OCI registry for tests: Debian's `docker-registry` (the CNCF distribution
 * server) on a loopback port with temporary storage, a front proxy that can demand a
 * Bearer token, drop a connection inside a blob or corrupt one, and push helpers that
 * speak the distribution API (used where skopeo cannot express the case: zstd layers
 * beside gzip ones, indexes, hostile tars).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import http from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tar from "tar";
import { which } from "../../src/util/run.js";
import { freePort } from "./net.js";

export const REGISTRY_TOOLS = ["docker-registry", "skopeo", "umoci", "zstd"] as const;

/** Why registry tests cannot run here, or null when they can. */
export async function registrySkipReason(): Promise<string | null> {
  for (const t of REGISTRY_TOOLS)
    if (!(await which(t))) return `${t} is not installed (scripts/setup installs it)`;
  return null;
}

export interface Registry {
  host: string;
  dir: string;
  stop: () => Promise<void>;
}

export async function startRegistry(): Promise<Registry> {
  const dir = await mkdtemp(join(tmpdir(), "pyro-registry-"));
  const port = await freePort();
  await mkdir(join(dir, "data"));
  await writeFile(
    join(dir, "config.yml"),
    [
      "version: 0.1",
      "log:",
      "  level: error",
      "storage:",
      "  filesystem:",
      `    rootdirectory: ${join(dir, "data")}`,
      "  delete:",
      "    enabled: true",
      "http:",
      `  addr: 127.0.0.1:${port}`,
      "",
    ].join("\n"),
  );
  const child: ChildProcess = spawn("docker-registry", ["serve", join(dir, "config.yml")], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  let err = "";
  child.stderr?.on("data", (d: Buffer) => {
    err += d.toString();
  });
  const host = `127.0.0.1:${port}`;
  const deadline = Date.now() + 20_000;
  for (;;) {
    const ok = await fetch(`http://${host}/v2/`).then(
      (r) => r.ok,
      () => false,
    );
    if (ok) break;
    if (Date.now() > deadline || child.exitCode !== null) throw new Error(`registry did not start: ${err}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    host,
    dir,
    stop: async () => {
      child.kill("SIGTERM");
      await new Promise((r) => (child.exitCode !== null ? r(null) : child.once("exit", r)));
      await rm(dir, { recursive: true, force: true });
    },
  };
}

export interface FrontOptions {
  /** Demand `Authorization: Bearer` (issued by /token for these Basic credentials). */
  credentials?: { username: string; password: string };
  /** Cut the connection after this many body bytes of the first GET of this blob. */
  drop?: { digest: string; afterBytes: number };
  /** Flip a byte in every body of this blob. */
  corrupt?: string;
}

/** A proxy in front of a registry with the faults and auth a test asks for; it logs requests. */
export interface Front {
  host: string;
  options: FrontOptions;
  requests: { method: string; path: string; range: string | null; auth: string | null }[];
  stop: () => Promise<void>;
}

export async function startFront(upstream: string, options: FrontOptions = {}): Promise<Front> {
  const port = await freePort();
  const host = `127.0.0.1:${port}`;
  const token = `tok-${Math.random().toString(36).slice(2)}`;
  const dropped = new Set<string>();
  const front: Front = { host, options, requests: [], stop: async () => {} };
  const server = http.createServer((req, res) => {
    const path = req.url ?? "/";
    front.requests.push({
      method: req.method ?? "GET",
      path,
      range: (req.headers.range as string | undefined) ?? null,
      auth: req.headers.authorization ?? null,
    });
    const creds = front.options.credentials;
    if (path.startsWith("/token")) {
      const want = creds
        ? `Basic ${Buffer.from(`${creds.username}:${creds.password}`).toString("base64")}`
        : null;
      if (want && req.headers.authorization !== want) {
        res.writeHead(401).end();
        return;
      }
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ token }));
      return;
    }
    if (creds && req.headers.authorization !== `Bearer ${token}`) {
      res
        .writeHead(401, {
          "www-authenticate": `Bearer realm="http://${host}/token",service="test-registry",scope="repository:x:pull"`,
          "content-type": "application/json",
        })
        .end('{"errors":[{"code":"UNAUTHORIZED"}]}');
      return;
    }
    const headers = { ...req.headers };
    delete headers.authorization;
    delete headers.host;
    const up = http.request(
      { host: "127.0.0.1", port: Number(upstream.split(":")[1]), path, method: req.method, headers },
      (ur) => {
        const blob = /\/blobs\/(sha256:[a-f0-9]{64})/.exec(path)?.[1];
        const drop = front.options.drop;
        const cutAt = blob && drop && drop.digest === blob && !dropped.has(blob) ? drop.afterBytes : -1;
        if (cutAt >= 0 && blob) dropped.add(blob);
        const corrupt = blob !== undefined && front.options.corrupt === blob && ur.statusCode === 200;
        res.writeHead(ur.statusCode ?? 502, ur.headers);
        let sent = 0;
        let flipped = false;
        ur.on("data", (chunk: Buffer) => {
          let c = chunk;
          if (corrupt && !flipped) {
            c = Buffer.from(chunk);
            c[0] = (c[0] ?? 0) ^ 0xff;
            flipped = true;
          }
          if (cutAt >= 0 && sent + c.length > cutAt) {
            res.write(c.subarray(0, cutAt - sent));
            ur.destroy();
            res.socket?.destroy();
            return;
          }
          sent += c.length;
          res.write(c);
        });
        ur.on("end", () => res.end());
      },
    );
    up.on("error", () => res.destroy());
    req.pipe(up);
  });
  await new Promise<void>((r) => server.listen(port, "127.0.0.1", r));
  front.stop = () =>
    new Promise((r) => {
      server.closeAllConnections();
      server.close(() => r());
    });
  return front;
}

export function sha256(b: Buffer): string {
  return `sha256:${createHash("sha256").update(b).digest("hex")}`;
}

/** Uploads a blob (monolithic upload) and returns its digest. */
export async function pushBlob(host: string, repo: string, bytes: Buffer): Promise<string> {
  const digest = sha256(bytes);
  const start = await fetch(`http://${host}/v2/${repo}/blobs/uploads/`, { method: "POST" });
  if (start.status !== 202) throw new Error(`upload start: ${start.status}`);
  const loc = new URL(start.headers.get("location") ?? "", `http://${host}`);
  loc.searchParams.set("digest", digest);
  const put = await fetch(loc, {
    method: "PUT",
    body: bytes,
    headers: { "content-type": "application/octet-stream" },
  });
  if (put.status !== 201) throw new Error(`upload: ${put.status} ${await put.text()}`);
  return digest;
}

export async function putManifest(
  host: string,
  repo: string,
  ref: string,
  body: object,
  mediaType: string,
): Promise<string> {
  const bytes = Buffer.from(JSON.stringify(body));
  const res = await fetch(`http://${host}/v2/${repo}/manifests/${ref}`, {
    method: "PUT",
    body: bytes,
    headers: { "content-type": mediaType },
  });
  if (res.status !== 201) throw new Error(`manifest put: ${res.status} ${await res.text()}`);
  return sha256(bytes);
}

export async function getManifest(
  host: string,
  repo: string,
  ref: string,
): Promise<{
  digest: string;
  json: { config: { digest: string; size: number; mediaType: string }; layers: object[] };
}> {
  const res = await fetch(`http://${host}/v2/${repo}/manifests/${ref}`, {
    headers: { accept: "application/vnd.oci.image.manifest.v1+json" },
  });
  const bytes = Buffer.from(await res.arrayBuffer());
  return { digest: sha256(bytes), json: JSON.parse(bytes.toString()) };
}

export async function getBlob(host: string, repo: string, digest: string): Promise<Buffer> {
  return Buffer.from(await (await fetch(`http://${host}/v2/${repo}/blobs/${digest}`)).arrayBuffer());
}

/** A tar (uncompressed) of a directory's contents, as a layer (node-tar keeps hard links as links). */
export async function tarDir(dir: string): Promise<Buffer> {
  const chunks: Buffer[] = [];
  const stream = tar.c({ cwd: dir, portable: false, noMtime: false }, ["."]);
  for await (const c of stream as AsyncIterable<Buffer>) chunks.push(c);
  return Buffer.concat(chunks);
}

/** A tar whose single entry has exactly this name (hostile names included). */
export function rawTar(
  entries: { path: string; type?: "File" | "Link" | "SymbolicLink"; linkpath?: string; body?: string }[],
): Buffer {
  const blocks: Buffer[] = [];
  for (const e of entries) {
    const body = Buffer.from(e.body ?? "");
    const h = new tar.Header({
      path: e.path,
      type: e.type ?? "File",
      size: e.type && e.type !== "File" ? 0 : body.length,
      mode: 0o644,
      mtime: new Date(0),
      uid: 0,
      gid: 0,
      ...(e.linkpath ? { linkpath: e.linkpath } : {}),
    });
    const block = Buffer.alloc(512);
    h.encode(block, 0);
    blocks.push(block);
    if (body.length > 0 && (!e.type || e.type === "File")) {
      blocks.push(body, Buffer.alloc((512 - (body.length % 512)) % 512));
    }
  }
  blocks.push(Buffer.alloc(1024));
  return Buffer.concat(blocks);
}
