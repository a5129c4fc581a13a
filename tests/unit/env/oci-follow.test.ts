/**
 * LayerFollower (src/env/oci/follow.ts): a layer is unpacked while it downloads, and what
 * was unpacked must be exactly the bytes of the layer's digest, whatever the download did.
 */
import { createHash } from "node:crypto";
import { appendFile, mkdtemp, rename, rm, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
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
});
