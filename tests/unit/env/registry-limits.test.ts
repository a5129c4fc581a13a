/**
 * The registry client reads what a registry sends only up to a bound (F6): manifests
 * 4 MiB and image configs 8 MiB (refused by content-length before reading, or cut off
 * while reading when the length is absent or lies), and a layer only up to the size its
 * manifest gives (a size that is absent or not positive is refused; a longer body is
 * refused and nothing is kept). A fake registry on loopback serves the hostile answers.
 */
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseReference } from "../../../src/env/oci/reference.js";
import { RegistryClient } from "../../../src/env/oci/registry.js";
import { PyroError } from "../../../src/errors.js";

const MiB = 1024 * 1024;
const sha = (b: Buffer) => `sha256:${createHash("sha256").update(b).digest("hex")}`;

type Handler = (req: http.IncomingMessage, res: http.ServerResponse) => void;
const routes = new Map<string, Handler>();
/** Bytes the server managed to write for each path (a capped reader stops early). */
const sent = new Map<string, number>();
let server: http.Server;
let host: string;
let dir: string;

/** Streams `total` bytes in 64 KiB chunks, with or without a content-length. */
function stream(
  path: string,
  total: number,
  withLength: boolean,
  type = "application/octet-stream",
): Handler {
  return (_req, res) => {
    res.writeHead(200, { "content-type": type, ...(withLength ? { "content-length": String(total) } : {}) });
    const chunk = Buffer.alloc(64 * 1024, 0x20);
    let n = 0;
    const pump = () => {
      while (n < total) {
        const c = chunk.subarray(0, Math.min(chunk.length, total - n));
        n += c.length;
        sent.set(path, n);
        if (!res.write(c)) {
          res.once("drain", pump);
          return;
        }
      }
      res.end();
    };
    res.on("error", () => {});
    pump();
  };
}

function client(repo: string): RegistryClient {
  return new RegistryClient(parseReference(`${host}/${repo}:t`), { env: {}, insecure: true });
}

async function refusal(p: Promise<unknown>): Promise<PyroError> {
  const err = await p.then(
    () => null,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(PyroError);
  return err as PyroError;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-registry-limits-"));
  server = http.createServer((req, res) => {
    const h = routes.get(req.url ?? "");
    if (h) h(req, res);
    else res.writeHead(404).end();
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  host = `127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise((r) => server.close(r));
  await rm(dir, { recursive: true, force: true });
});

describe("registry client bounds", () => {
  it("refuses a manifest whose content-length is over 4 MiB without reading it", async () => {
    routes.set("/v2/big-len/manifests/t", stream("big-len", 64 * MiB, true));
    const err = await refusal(client("big-len").manifest("t"));
    expect(err.code).toBe("build_failed");
    expect(err.message).toContain("larger than 4 MiB");
    expect(sent.get("big-len") ?? 0).toBeLessThan(32 * MiB);
  });

  it("cuts off a manifest without a content-length once it passes 4 MiB", async () => {
    routes.set("/v2/big-chunked/manifests/t", stream("big-chunked", 64 * MiB, false));
    const err = await refusal(client("big-chunked").manifest("t"));
    expect(err.message).toContain("larger than 4 MiB");
    expect(sent.get("big-chunked") ?? 0).toBeLessThan(32 * MiB);
  });

  it("cuts off an image config past 8 MiB, and refuses layers without a positive size", async () => {
    const config = Buffer.alloc(0);
    const manifest = (layers: unknown[]) =>
      Buffer.from(
        JSON.stringify({
          schemaVersion: 2,
          mediaType: "application/vnd.oci.image.manifest.v1+json",
          config: { mediaType: "application/vnd.oci.image.config.v1+json", digest: sha(config), size: 1 },
          layers,
        }),
      );
    const json =
      (b: Buffer): Handler =>
      (_q, r) => {
        r.writeHead(200, { "content-type": "application/vnd.oci.image.manifest.v1+json" }).end(b);
      };
    const layer = { mediaType: "application/vnd.oci.image.layer.v1.tar", digest: sha(Buffer.from("x")) };
    routes.set("/v2/big-config/manifests/t", json(manifest([{ ...layer, size: 1 }])));
    routes.set(`/v2/big-config/blobs/${sha(config)}`, stream("big-config", 64 * MiB, false));
    const err = await refusal(client("big-config").resolve());
    expect(err.message).toContain("image config is larger than 8 MiB");
    expect(sent.get("big-config") ?? 0).toBeLessThan(32 * MiB);

    for (const size of [0, -1, undefined]) {
      routes.set("/v2/no-size/manifests/t", json(manifest([{ ...layer, size }])));
      const e = await refusal(client("no-size").resolve());
      expect(e.message).toContain("has no valid size");
    }
  });

  it("refuses a layer descriptor without a positive size before downloading", async () => {
    const body = Buffer.from("layer bytes");
    routes.set(`/v2/zero/blobs/${sha(body)}`, stream("zero", 64 * MiB, false));
    const partial = join(dir, "zero.partial");
    const err = await refusal(
      client("zero").download(
        { mediaType: "x", digest: sha(body), size: 0 },
        partial,
        join(dir, "zero"),
        () => {},
      ),
    );
    expect(err.message).toContain("has no valid size");
    expect(sent.has("zero")).toBe(false);
  });

  it("stops a layer at its manifest's size: a longer body is refused and nothing is kept", async () => {
    const body = Buffer.alloc(1000, 7);
    routes.set(`/v2/long/blobs/${sha(body)}`, stream("long", 64 * MiB, false));
    const partial = join(dir, "long.partial");
    const dest = join(dir, "long");
    let got = 0;
    const err = await refusal(
      client("long").download(
        { mediaType: "x", digest: sha(body), size: body.length },
        partial,
        dest,
        (n) => {
          got += n;
        },
      ),
    );
    expect(err.message).toContain("more bytes");
    expect(got).toBeLessThanOrEqual(body.length);
    expect(existsSync(partial)).toBe(false);
    expect(existsSync(dest)).toBe(false);
    expect(sent.get("long") ?? 0).toBeLessThan(32 * MiB);
  });

  it("still downloads a layer of exactly its size", async () => {
    const body = Buffer.alloc(200_000, 3);
    routes.set(`/v2/ok/blobs/${sha(body)}`, (_q, r) => {
      r.writeHead(200, { "content-length": String(body.length) }).end(body);
    });
    const dest = join(dir, "ok");
    await client("ok").download(
      { mediaType: "x", digest: sha(body), size: body.length },
      join(dir, "ok.p"),
      dest,
      () => {},
    );
    expect(existsSync(dest)).toBe(true);
  });
});
