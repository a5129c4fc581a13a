/**
 * Bounds on what a registry sends (docs/environments.md): a manifest or an image config
 * is read only up to a cap, and a layer only up to the size its manifest gives.
 */
import { PyroError } from "../../errors.js";
import type { Descriptor } from "./registry.js";

export const MAX_MANIFEST = 4 * 1024 * 1024;
/** An image config is JSON of a few KiB; anything near this is not one. */
export const MAX_CONFIG = 8 * 1024 * 1024;

/** A layer's size must be known and positive: the download stops there. */
export function checkSize(d: Descriptor): void {
  if (!Number.isSafeInteger(d.size) || d.size <= 0) {
    throw new PyroError(
      "build_failed",
      `layer ${String(d.digest)} has no valid size (${String(d.size)}) in the manifest`,
      "pyro downloads a layer only up to the size its manifest gives",
    );
  }
}

/**
 * Reads a response body of at most `max` bytes: a larger `content-length` is refused
 * before reading, and a body that runs past `max` is cut off and refused.
 */
export async function readCapped(res: Response, max: number, what: string): Promise<Buffer> {
  const tooLarge = () =>
    new PyroError(
      "build_failed",
      `${what} is larger than ${max / 1024 / 1024} MiB`,
      "check the image reference",
    );
  const length = Number(res.headers.get("content-length") ?? "");
  if (Number.isFinite(length) && length > max) {
    await res.body?.cancel().catch(() => {});
    throw tooLarge();
  }
  if (!res.body) return Buffer.alloc(0);
  const chunks: Buffer[] = [];
  let total = 0;
  const reader = (res.body as ReadableStream<Uint8Array>).getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.byteLength;
    if (total > max) {
      await reader.cancel().catch(() => {});
      throw tooLarge();
    }
    chunks.push(Buffer.from(value.buffer, value.byteOffset, value.byteLength));
  }
  return Buffer.concat(chunks, total);
}
