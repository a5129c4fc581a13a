/** How many leading bytes `compressionOf` needs to tell (zstd's magic is the longest). */
export const MAGIC_BYTES = 4;

/**
 * The compression a stream starts with, told by its magic bytes: gzip (1f 8b) or zstd
 * (28 b5 2f fd); null for anything else, a plain tar included.
 */
export function compressionOf(head: Uint8Array): "gzip" | "zstd" | null {
  if (head[0] === 0x1f && head[1] === 0x8b) return "gzip";
  if (head[0] === 0x28 && head[1] === 0xb5 && head[2] === 0x2f && head[3] === 0xfd) return "zstd";
  return null;
}
