/**
 * LayerFollower (src/env/oci/follow.ts): a layer is unpacked while it downloads, and what
 * was unpacked must be exactly the bytes of the layer's digest, whatever the download did.
 */
import { createHash, randomBytes } from "node:crypto";
import { appendFile, mkdtemp, rename, rm, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { createGunzip, gzipSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LayerFollower } from "../../../src/env/oci/follow.js";

const sha = (b: Buffer) => `sha256:${createHash("sha256").update(b).digest("hex")}`;
const tick = () => new Promise((r) => setTimeout(r, 20));

async function readAll(f: LayerFollower): Promise<Buffer> {
  const { stream } = await f.stream(4);
  const chunks: Buffer[] = [];
  for await (const c of stream) chunks.push(c as Buffer);
  await f.finish();
  return Buffer.concat(chunks);
}

describe("LayerFollower", () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "pyro-follow-"));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("follows a file that grows, across the rename to the store, and checks its digest", async () => {
    const body = Buffer.from("x".repeat(3000) + "y".repeat(3000));
    const partial = join(dir, "p1");
    const blob = join(dir, "b1");
    const download = (async () => {
      await tick();
      for (let i = 0; i < body.length; i += 1000) {
        await appendFile(partial, body.subarray(i, i + 1000));
        await tick();
      }
      await rename(partial, blob);
    })();
    const got = await readAll(new LayerFollower(partial, blob, sha(body), body.length, download));
    expect(got.equals(body)).toBe(true);
  });

  it("refuses bytes that do not match the digest", async () => {
    const body = Buffer.from("good content");
    const partial = join(dir, "p2");
    await writeFile(partial, Buffer.from("evil content"));
    const f = new LayerFollower(partial, join(dir, "b2"), sha(body), body.length, Promise.resolve());
    await expect(readAll(f)).rejects.toMatchObject({ code: "build_failed" });
  });

  it("refuses what it read when the download restarted from byte 0 with other bytes, even if the final file is right", async () => {
    const body = Buffer.from("A".repeat(4000));
    const partial = join(dir, "p3");
    await writeFile(partial, Buffer.from("B".repeat(2000)));
    let restarted: () => void = () => {};
    const download = new Promise<void>((r) => {
      restarted = r;
    });
    const f = new LayerFollower(partial, join(dir, "b3"), sha(body), body.length, download);
    const { stream } = await f.stream(4);
    const reading = (async () => {
      for await (const _ of stream) {
        // The server ignored the Range request: the download starts over with the right bytes.
        await truncate(partial, 0);
        await writeFile(partial, body);
        restarted();
      }
    })();
    await expect(reading).rejects.toMatchObject({ code: "build_failed" });
    await f.close();
  });

  it("fails with the download's error when the download fails", async () => {
    const partial = join(dir, "p4");
    await writeFile(partial, Buffer.from("12"));
    const err = Object.assign(new Error("dropped for good"), { code: "build_failed" });
    const f = new LayerFollower(partial, join(dir, "b4"), sha(Buffer.from("1234")), 4, Promise.reject(err));
    await expect(readAll(f)).rejects.toThrow("dropped for good");
    await f.close();
  });

  it("verifies a valid layer whose unpacker stops early (gzip member, then more bytes) while its stream still reads", async () => {
    // gunzip ends with its member; the stream piped into it keeps pulling while finish()
    // reads the rest: both must read in turn, each byte hashed once, in order.
    for (const trailing of [randomBytes(4 << 20), Buffer.alloc(4 << 20)]) {
      trailing[0] = 0;
      const body = Buffer.concat([gzipSync(Buffer.alloc(100_000, 7)), trailing]);
      const partial = join(dir, `p-trailing-${trailing[1]}`);
      await writeFile(partial, body);
      const f = new LayerFollower(
        partial,
        join(dir, "b-trailing"),
        sha(body),
        body.length,
        Promise.resolve(),
      );
      const { stream } = await f.stream(4);
      const gunzip = stream.pipe(createGunzip({ chunkSize: 1 << 20 }));
      await pipeline(
        gunzip,
        new Writable({
          write(_c, _e, cb) {
            cb();
          },
        }),
      );
      await expect(f.finish()).resolves.toBeUndefined();
    }
  });

  it("fails, instead of waiting forever, when the download finished but its blob is gone", async () => {
    const f = new LayerFollower(
      join(dir, "none-p"),
      join(dir, "none-b"),
      sha(Buffer.from("x")),
      1,
      Promise.resolve(),
    );
    await tick();
    await expect(readAll(f)).rejects.toMatchObject({
      code: "build_failed",
      message: expect.stringContaining("disappeared"),
    });
  });
});
