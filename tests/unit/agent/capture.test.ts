import { describe, expect, it } from "vitest";
import {
  clipText,
  completePrefix,
  HeadTailCapture,
  MARKER_MAX_BYTES,
  omittedMarker,
} from "../../../src/agent/capture.js";

/** Feeds `data` in chunks of the given sizes (cycled), as a pipe would. */
function capture(data: Buffer | string, cap: number, chunkSizes: number[] = [65536]) {
  const buf = typeof data === "string" ? Buffer.from(data) : data;
  const c = new HeadTailCapture(cap);
  for (let i = 0, k = 0; i < buf.length; k++) {
    const n = chunkSizes[k % chunkSizes.length]!;
    c.push(buf.subarray(i, i + n));
    i += n;
  }
  return c;
}

const lines = (n: number) => Array.from({ length: n }, (_, i) => `${i + 1}\n`).join("");
const MARKER = /\[\.\.\. (\d+) bytes omitted \.\.\.\]\n/;

/**
 * Splits a captured text into head, omitted count and tail. The marker starts a line: the
 * newline before it is the head's own when the head ended a line, else added, so
 * `newlineInData` says which (the data's head ends a line, or the data has no newlines).
 */
function parts(text: string, newlineInData = false): { head: string; omitted: number; tail: string } {
  const m = MARKER.exec(text);
  if (!m) return { head: text, omitted: 0, tail: "" };
  const before = text.slice(0, m.index);
  const head = newlineInData || before === "" ? before : before.slice(0, -1);
  return { head, omitted: Number(m[1]), tail: text.slice(m.index + m[0].length) };
}

describe("HeadTailCapture", () => {
  it("leaves a stream of at most cap bytes untouched, and counts its bytes", () => {
    for (const text of ["", "hi\n", "x".repeat(1024)]) {
      const r = capture(text, 1024).render();
      expect(r).toEqual({ text, bytes: Buffer.byteLength(text), truncated: false });
    }
  });

  it("past the cap keeps the first and the last half, with one marker line saying exactly how much was left out", () => {
    const data = lines(100_000);
    const r = capture(data, 1000).render();
    expect(r.bytes).toBe(data.length);
    expect(r.truncated).toBe(true);
    const p = parts(r.text, data[499] === "\n");
    expect(p.head).toBe(data.slice(0, 500));
    expect(p.tail).toBe(data.slice(-500));
    expect(p.omitted).toBe(data.length - 1000);
    expect(p.head.length + p.omitted + p.tail.length).toBe(data.length);
    expect(r.text.endsWith("99999\n100000\n")).toBe(true);
  });

  it("puts the marker on a line of its own", () => {
    expect(capture("a".repeat(5000), 1000).render().text).toBe(
      `${"a".repeat(500)}\n[... 4000 bytes omitted ...]\n${"a".repeat(500)}`,
    );
    expect(capture("ab\n".repeat(2000), 1000).render().text.split("\n")).toContain(
      "[... 5000 bytes omitted ...]",
    );
    expect(omittedMarker(1, true)).toBe("[... 1 bytes omitted ...]\n");
    expect(Buffer.byteLength(omittedMarker(Number.MAX_SAFE_INTEGER, false))).toBeLessThanOrEqual(
      MARKER_MAX_BYTES,
    );
  });

  it("gives the same text whatever the chunking", () => {
    const data = Buffer.from(lines(3000) + "é€😀".repeat(500) + lines(3000));
    const whole = capture(data, 4096).render();
    for (const sizes of [[1], [7, 3, 4096], [100_000], [4095, 1, 2]]) {
      expect(capture(data, 4096, sizes).render()).toEqual(whole);
    }
  });

  it("never splits a multi-byte character at either cut, and the count includes what a cut dropped", () => {
    for (const ch of ["é", "€", "😀"]) {
      const data = ch.repeat(10_000);
      const size = Buffer.byteLength(data);
      for (const cap of [1001, 1002, 1003, 1024]) {
        const r = capture(data, cap, [1, 5, 333]).render();
        expect(r.text).not.toContain("\uFFFD");
        const p = parts(r.text);
        expect(p.head).toMatch(new RegExp(`^(${ch})+$`, "u"));
        expect(p.tail).toMatch(new RegExp(`^(${ch})+$`, "u"));
        const kept = Buffer.byteLength(p.head) + Buffer.byteLength(p.tail);
        expect(kept).toBeLessThanOrEqual(cap);
        expect(kept).toBeGreaterThan(cap - 8);
        expect(p.omitted).toBe(size - kept);
      }
    }
  });

  it("keeps a character whole across the head/tail boundary when nothing is dropped", () => {
    const data = `${"a".repeat(511)}€${"b".repeat(400)}`; // € straddles byte 512, the head's end
    expect(capture(data, 1024, [1]).render().text).toBe(data);
  });

  it("renders at a smaller cap exactly as a capture made at that cap", () => {
    const data = lines(50_000);
    const big = capture(data, 1 << 20);
    for (const cap of [1000, 4096, 200_000, data.length, data.length + 5]) {
      expect(big.render(cap)).toEqual(capture(data, cap).render());
    }
  });

  it("keeps bounded memory: a window over the tail, not the whole stream", () => {
    const c = new HeadTailCapture(2048);
    const chunk = Buffer.alloc(1000, 0x61);
    for (let i = 0; i < 10_000; i++) c.push(chunk);
    const held = (c as unknown as { tail: Buffer[] }).tail.reduce((n, b) => n + b.length, 0);
    expect(held).toBeLessThanOrEqual(1024 + chunk.length);
    expect(c.render().bytes).toBe(10_000_000);
  });
});

describe("clipText", () => {
  it("returns text within the cap as it is", () => {
    expect(clipText("hello\n", 1024)).toBe("hello\n");
    expect(clipText("x".repeat(1024), 1024)).toBe("x".repeat(1024));
  });

  it("cuts a captured text again at a smaller cap exactly as a capture at that cap would", () => {
    const data = lines(200_000);
    const first = capture(data, 1 << 20).render();
    for (const cap of [1024, 16_384, 100_000, (1 << 20) - 100]) {
      expect(clipText(first.text, cap, first.bytes)).toBe(capture(data, cap).render().text);
    }
  });

  it("leaves a captured text alone at the cap it was captured with", () => {
    const first = capture(lines(100_000), 4096).render();
    expect(clipText(first.text, 4096, first.bytes)).toBe(first.text);
  });

  it("cuts plain text to head and tail on character boundaries", () => {
    const text = "é".repeat(3000);
    const out = clipText(text, 1001);
    const p = parts(out);
    expect(out).not.toContain("\uFFFD");
    expect(p.omitted).toBe(6000 - Buffer.byteLength(p.head) - Buffer.byteLength(p.tail));
  });
});

describe("completePrefix", () => {
  it("drops only a trailing incomplete sequence", () => {
    const euro = Buffer.from("€"); // e2 82 ac
    expect(completePrefix(Buffer.concat([Buffer.from("a"), euro]))).toBe(4);
    expect(completePrefix(Buffer.concat([Buffer.from("a"), euro.subarray(0, 2)]))).toBe(1);
    expect(completePrefix(Buffer.concat([Buffer.from("a"), euro.subarray(0, 1)]))).toBe(1);
    expect(completePrefix(Buffer.from("abc"))).toBe(3);
    expect(completePrefix(Buffer.from([0x80, 0x80, 0x80, 0x80]))).toBe(4);
  });
});
