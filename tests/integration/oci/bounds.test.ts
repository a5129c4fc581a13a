/**
 * What a pulled layer may write on the host (src/env/oci/unpack-budget.ts), against a real
 * registry (Debian's docker-registry on loopback): a gzip bomb is refused as its bytes
 * flow, pulled by tag, by digest or from a verified blob in the store, and nothing of it
 * stays; a pull whose downloads or layers would not leave the reserve free on the cache's
 * filesystem is refused (a fake statfs stands for a full disk), naming the layer.
 */
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import * as tar from "tar";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EnvironmentCache } from "../../../src/env/cache.js";
import { OciBuilder } from "../../../src/env/oci/builder.js";
import { type Statfs, UNPACK_BOUNDS, type UnpackBounds } from "../../../src/env/oci/unpack-budget.js";
import { PyroError } from "../../../src/errors.js";
import {
  pushBlob,
  putManifest,
  type Registry,
  rawTar,
  registrySkipReason,
  sha256,
  startFront,
  startRegistry,
} from "../../helpers/registry.js";

const skip = await registrySkipReason();
const MiB = 1024 * 1024;
const OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json";
const GZIP_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip";

/**
 * A layer of one file of `gib` GiB of zeros in about 64 KiB of gzip per 64 MiB: the tar
 * header, the contents and the end blocks as concatenated gzip members (one gzip stream).
 */
function gzipBomb(gib: number): Buffer {
  const header = Buffer.alloc(512);
  new tar.Header({
    path: "bomb",
    type: "File",
    size: gib * 1024 * MiB,
    mode: 0o644,
    mtime: new Date(0),
  }).encode(header, 0);
  const zeros = gzipSync(Buffer.alloc(64 * MiB));
  return Buffer.concat([gzipSync(header), ...new Array(gib * 16).fill(zeros), gzipSync(Buffer.alloc(1024))]);
}

/** A statfs of a filesystem with `bytes` available and plenty of inodes. */
const fakeStatfs =
  (bytes: number): Statfs =>
  () => ({ bavail: Math.floor(bytes / 4096), bsize: 4096, ffree: 1e7, files: 1e7 });

describe.skipIf(skip !== null)(
  `bounds on what a pulled layer writes${skip ? ` (skipped: ${skip})` : ""}`,
  () => {
    let registry: Registry;
    let work: string;
    let bomb: Buffer;
    let bombDigest: string;
    let bombImage: string;
    /** A small layer first, then `text`: 8 MiB of text in a few hundred KiB of gzip. */
    let textImage: string;
    let textLayers: { digest: string; size: number }[];

    async function push(repo: string, layers: Buffer[]): Promise<string> {
      const config = Buffer.from(
        JSON.stringify({
          architecture: "amd64",
          os: "linux",
          config: {},
          // Not checked by pyro; hashing the bomb's 1 GiB would only slow the test.
          rootfs: { type: "layers", diff_ids: layers.map((l) => sha256(l)) },
        }),
      );
      const descs = [];
      for (const l of layers)
        descs.push({ mediaType: GZIP_LAYER, digest: await pushBlob(registry.host, repo, l), size: l.length });
      const body = {
        schemaVersion: 2,
        mediaType: OCI_MANIFEST,
        config: {
          mediaType: "application/vnd.oci.image.config.v1+json",
          digest: await pushBlob(registry.host, repo, config),
          size: config.length,
        },
        layers: descs,
      };
      return putManifest(registry.host, repo, "1", body, OCI_MANIFEST);
    }

    async function cache(options: { bounds?: UnpackBounds; statfs?: Statfs } = {}) {
      const root = await mkdtemp(join(work, "envs-"));
      const builder = new OciBuilder({ storeDir: join(root, ".oci"), env: {}, ...options });
      return { root, cache: new EnvironmentCache(root, [builder]) };
    }

    async function refusal(p: Promise<unknown>): Promise<PyroError> {
      const err = await p.then(
        () => null,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(PyroError);
      return err as PyroError;
    }

    /** Nothing of a refused pull stays: no environment, no build directory, no blob or partial of `digest`. */
    async function expectNothingKept(root: string, digest: string) {
      expect((await readdir(root)).filter((d) => !d.startsWith("."))).toEqual([]);
      expect((await readdir(root)).filter((d) => d.startsWith(".building"))).toEqual([]);
      expect(existsSync(join(root, ".oci/blobs/sha256", digest.slice(7)))).toBe(false);
      expect(existsSync(join(root, ".oci/partial", digest.slice(7)))).toBe(false);
    }

    beforeAll(async () => {
      registry = await startRegistry();
      work = await mkdtemp(join(tmpdir(), "pyro-oci-bounds-"));
      const small = gzipSync(rawTar([{ path: "etc/hello.txt", body: "hello\n" }]));
      bomb = gzipBomb(1);
      bombDigest = sha256(bomb);
      bombImage = await push("t/bomb", [small, bomb]);
      const text = gzipSync(
        rawTar([{ path: "data.txt", body: "a line of text in a file\n".repeat(8 * 42_000) }]),
      );
      textImage = await push("t/text", [small, text]);
      textLayers = [small, text].map((l) => ({ digest: sha256(l), size: l.length }));
    }, 120_000);

    afterAll(async () => {
      await registry?.stop();
      if (work) await rm(work, { recursive: true, force: true });
    });

    it("refuses a gzip bomb pulled by tag after writing about the floor, not the 1 GiB it holds, and keeps nothing of it", async () => {
      const { cache: c, root } = await cache();
      const err = await refusal(c.pull(`${registry.host}/t/bomb:1`));
      expect(err.code).toBe("build_failed");
      expect(err.message).toContain(`refused layer 2/2 (${bombDigest})`);
      expect(err.message).toContain("more than 256.0 MiB + 20x its compressed bytes");
      expect(err.hint).toMatch(/decompression bomb.*nothing was kept/);
      // "(W MiB from R ... read": what it had written when refused.
      const written = Number(/\(([\d.]+) MiB from /.exec(err.message)?.[1]);
      expect(written).toBeGreaterThan(256);
      expect(written).toBeLessThan(256 + (20 * bomb.length) / MiB + 2);
      await expectNothingKept(root, bombDigest);
    }, 120_000);

    it("refuses it pulled by digest, and from a verified blob already in the store (deleted after)", async () => {
      const bounds = { ...UNPACK_BOUNDS, floorBytes: 16 * MiB };
      const byDigest = await cache({ bounds });
      const err = await refusal(byDigest.cache.pull(`${registry.host}/t/bomb@${bombImage}`));
      expect(err.message).toContain("more than 16.0 MiB + 20x");
      await expectNothingKept(byDigest.root, bombDigest);

      const stored = await cache({ bounds });
      await mkdir(join(stored.root, ".oci/blobs/sha256"), { recursive: true });
      await writeFile(join(stored.root, ".oci/blobs/sha256", bombDigest.slice(7)), bomb);
      const front = await startFront(registry.host);
      try {
        const e = await refusal(stored.cache.pull(`${front.host}/t/bomb:1`));
        expect(e.message).toContain(`refused layer 2/2 (${bombDigest})`);
        // The layer came from the store, not the registry.
        expect(front.requests.some((q) => q.path.endsWith(bombDigest))).toBe(false);
        await expectNothingKept(stored.root, bombDigest);
      } finally {
        await front.stop();
      }
    }, 120_000);

    it("refuses, before downloading anything, a pull whose layers do not fit with the reserve left free", async () => {
      const need = textLayers.reduce((a, l) => a + l.size, 0);
      const { cache: c, root } = await cache({
        statfs: fakeStatfs(UNPACK_BOUNDS.reserveBytes + need - 4096),
      });
      const front = await startFront(registry.host);
      try {
        const err = await refusal(c.pull(`${front.host}/t/text:1`));
        expect(err.code).toBe("build_failed");
        expect(err.message).toMatch(/refused the pull: its layers need .* pyro keeps 1\.0 GiB free/);
        expect(err.hint).toContain("pyro env prune");
        const layerGets = front.requests.filter((q) => textLayers.some((l) => q.path.endsWith(l.digest)));
        expect(layerGets).toEqual([]);
        for (const l of textLayers) await expectNothingKept(root, l.digest);
      } finally {
        await front.stop();
      }
    });

    it("refuses a layer whose unpacking would eat into the reserve, naming it, and keeps nothing of it", async () => {
      const need = textLayers.reduce((a, l) => a + l.size, 0);
      // Room for the downloads and 1 MiB more: the 8 MiB text does not fit.
      const { cache: c, root } = await cache({ statfs: fakeStatfs(UNPACK_BOUNDS.reserveBytes + need + MiB) });
      const err = await refusal(c.pull(`${registry.host}/t/text:1`));
      const text = textLayers[1] as { digest: string };
      expect(err.message).toContain(`refused layer 2/2 (${text.digest}) after`);
      expect(err.message).toContain("pyro keeps 1.0 GiB free");
      await expectNothingKept(root, text.digest);
      // With the host's real free space the same image pulls (the bounds do not refuse it).
      const ok = await cache();
      const r = await ok.cache.pull(`${registry.host}/t/text:1`);
      expect(r.digest).toBe(textImage);
      expect(existsSync(join(r.rootfs, "data.txt"))).toBe(true);
    });
  },
);
