import { describe, expect, it } from "vitest";
import { compressionOf, MAGIC_BYTES } from "../../../src/util/compression.js";

describe("compressionOf", () => {
  it("tells gzip and zstd by their magic, and nothing else", () => {
    expect(compressionOf(Buffer.from([0x1f, 0x8b, 0x08, 0x00]))).toBe("gzip");
    expect(compressionOf(Buffer.from([0x28, 0xb5, 0x2f, 0xfd]))).toBe("zstd");
    // A plain tar starts with a name; a short or empty head is not compressed either.
    expect(compressionOf(Buffer.from("etc/passwd"))).toBeNull();
    expect(compressionOf(Buffer.from([0x28, 0xb5, 0x2f]))).toBeNull();
    expect(compressionOf(Buffer.alloc(0))).toBeNull();
    expect(MAGIC_BYTES).toBe(4);
  });
});
