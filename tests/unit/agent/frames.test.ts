import { describe, expect, it } from "vitest";
import {
  encodeFrame,
  FRAME_HEADER_BYTES,
  FrameDecoder,
  FrameKind,
  MAX_FRAME_PAYLOAD,
  ProtocolViolation,
} from "../../../src/agent/frames.js";

function header(length: number, kind: number, channel: number): Buffer {
  const b = Buffer.alloc(9);
  b.writeUInt32BE(length, 0);
  b.writeUInt8(kind, 4);
  b.writeUInt32BE(channel, 5);
  return b;
}

describe("frame codec", () => {
  it("encodes length, kind and channel big-endian before the payload", () => {
    const frame = encodeFrame(FrameKind.Data, 0x01020304, Buffer.from("hey"));
    expect([...frame.subarray(0, FRAME_HEADER_BYTES)]).toEqual([0, 0, 0, 8, 2, 1, 2, 3, 4]);
    expect(frame.subarray(FRAME_HEADER_BYTES).toString()).toBe("hey");
  });

  it("decodes the same frames whatever the chunk boundaries", () => {
    const frames = [
      encodeFrame(FrameKind.Message, 0, Buffer.from('{"type":"hello"}')),
      encodeFrame(FrameKind.Data, 7, Buffer.alloc(5000, 0xab)),
      encodeFrame(FrameKind.End, 7),
      encodeFrame(FrameKind.Abort, 9, Buffer.from("why")),
    ];
    const wire = Buffer.concat(frames);
    // Every split size from 1 byte up, plus a pseudo-random split.
    const splits: number[][] = [1, 2, 3, 8, 9, 10, 4096, wire.length].map((n) => {
      const cuts: number[] = [];
      for (let at = 0; at < wire.length; at += n) cuts.push(Math.min(n, wire.length - at));
      return cuts;
    });
    let seed = 7;
    const random: number[] = [];
    for (let at = 0; at < wire.length; ) {
      seed = (seed * 1103515245 + 12345) % 2 ** 31;
      const n = Math.min(1 + (seed % 700), wire.length - at);
      random.push(n);
      at += n;
    }
    splits.push(random);
    for (const cuts of splits) {
      const decoder = new FrameDecoder();
      const out = [];
      let at = 0;
      for (const n of cuts) {
        out.push(...decoder.push(wire.subarray(at, at + n)));
        at += n;
      }
      decoder.end();
      expect(out.map((f) => [f.kind, f.channel, f.payload.length])).toEqual([
        [1, 0, 16],
        [2, 7, 5000],
        [3, 7, 0],
        [4, 9, 3],
      ]);
      expect(out[1]!.payload.equals(Buffer.alloc(5000, 0xab))).toBe(true);
    }
  });

  it("accepts a payload of exactly MAX_FRAME_PAYLOAD bytes", () => {
    const decoder = new FrameDecoder();
    const frames = decoder.push(encodeFrame(FrameKind.Data, 1, Buffer.alloc(MAX_FRAME_PAYLOAD)));
    expect(frames[0]!.payload.length).toBe(MAX_FRAME_PAYLOAD);
  });

  it("refuses an oversize frame from its header alone, before the payload arrives", () => {
    const decoder = new FrameDecoder();
    expect(() => decoder.push(header(5 + MAX_FRAME_PAYLOAD + 1, 2, 1))).toThrow(ProtocolViolation);
    // Broken for good: the stream can no longer be trusted.
    expect(() => decoder.push(encodeFrame(FrameKind.End, 1))).toThrow(ProtocolViolation);
  });

  it("refuses a huge length such as ASCII text read as a header", () => {
    expect(() => new FrameDecoder().push(Buffer.from("GET / HTTP/1.1\r\n"))).toThrow(/exceeds/);
  });

  it("refuses unknown kinds, short lengths and kind/channel combinations the protocol forbids", () => {
    expect(() => new FrameDecoder().push(header(5, 9, 0))).toThrow(/unknown frame kind 9/);
    expect(() => new FrameDecoder().push(header(4, 1, 0))).toThrow(/shorter than its header/);
    expect(() => new FrameDecoder().push(header(5, 1, 3))).toThrow(/channel 3/);
    expect(() => new FrameDecoder().push(Buffer.concat([header(6, 3, 1), Buffer.from("x")]))).toThrow(
      /non-empty/,
    );
    expect(() => new FrameDecoder().push(header(5, 4, 0))).toThrow(/abort frame on channel 0/);
  });

  it("reports a stream that ends inside a frame", () => {
    const decoder = new FrameDecoder();
    const frame = encodeFrame(FrameKind.Message, 0, Buffer.from("{}"));
    expect(decoder.push(frame.subarray(0, 6))).toEqual([]);
    expect(() => decoder.end()).toThrow(/ended inside a frame/);
  });

  it("never encodes a frame it would refuse to decode", () => {
    expect(() => encodeFrame(FrameKind.Data, 1, Buffer.alloc(MAX_FRAME_PAYLOAD + 1))).toThrow(
      ProtocolViolation,
    );
    expect(() => encodeFrame(FrameKind.Message, 2, Buffer.from("{}"))).toThrow(ProtocolViolation);
    expect(() => encodeFrame(FrameKind.Data, -1)).toThrow(ProtocolViolation);
  });
});
