import { Duplex, PassThrough } from "node:stream";
import { describe, expect, it } from "vitest";
import {
  ExecChannel,
  encodeFrame,
  type Frame,
  FramingError,
  StreamDemuxer,
} from "../../../src/backends/docker/stream.js";

/** Joins demuxed pieces per stream. */
function collect(frames: Frame[]): Record<number, string> {
  const out: Record<number, string> = {};
  for (const f of frames) out[f.stream] = (out[f.stream] ?? "") + f.data.toString("utf8");
  return out;
}

const STREAM = Buffer.concat([
  encodeFrame(1, "hello "),
  encodeFrame(2, "warning: x\n"),
  encodeFrame(1, ""),
  encodeFrame(1, "world\n"),
  encodeFrame(2, "more\n"),
]);

describe("docker stream demultiplexing", () => {
  it("separates stdout and stderr frames from one multiplexed stream", () => {
    const d = new StreamDemuxer();
    expect(collect(d.push(STREAM))).toEqual({ 1: "hello world\n", 2: "warning: x\nmore\n" });
    expect(d.midFrame).toBe(false);
  });

  it("gives the same result whichever way the stream is split into chunks, down to single bytes", () => {
    for (const size of [1, 2, 3, 7, 8, 9, 13]) {
      const d = new StreamDemuxer();
      const frames: Frame[] = [];
      for (let i = 0; i < STREAM.length; i += size) frames.push(...d.push(STREAM.subarray(i, i + size)));
      expect(collect(frames), `chunks of ${size}`).toEqual({ 1: "hello world\n", 2: "warning: x\nmore\n" });
      expect(d.midFrame).toBe(false);
    }
  });

  it("passes a large payload through in pieces without waiting for the whole frame", () => {
    const big = Buffer.alloc(1 << 20, 0x61);
    const framed = encodeFrame(1, big);
    const d = new StreamDemuxer();
    const first = d.push(framed.subarray(0, 8 + 1000));
    expect(first).toHaveLength(1);
    expect(first[0]!.data.length).toBe(1000);
    expect(d.midFrame).toBe(true);
    const rest = d.push(framed.subarray(8 + 1000));
    expect(rest.reduce((n, f) => n + f.data.length, 0)).toBe(big.length - 1000);
    expect(d.midFrame).toBe(false);
  });

  it("refuses a header with an unknown stream id or non-zero padding (fail closed)", () => {
    expect(() => new StreamDemuxer().push(Buffer.from([9, 0, 0, 0, 0, 0, 0, 1, 0x41]))).toThrow(FramingError);
    expect(() => new StreamDemuxer().push(Buffer.from([1, 0, 1, 0, 0, 0, 0, 1, 0x41]))).toThrow(FramingError);
    // Raw text (what a TTY stream looks like) is not mistaken for frames.
    expect(() => new StreamDemuxer().push(Buffer.from("HTTP/1.1 200 OK\r\n"))).toThrow(FramingError);
  });

  it("knows when a stream stopped inside a header or a payload", () => {
    const d = new StreamDemuxer();
    d.push(encodeFrame(1, "abc").subarray(0, 5));
    expect(d.midFrame).toBe(true);
    const e = new StreamDemuxer();
    e.push(encodeFrame(1, "abc").subarray(0, 10));
    expect(e.midFrame).toBe(true);
  });
});

/** A fake hijacked connection: what the channel writes lands in `toEngine`, `fromEngine` feeds it. */
function fakeConnection() {
  const toEngine = new PassThrough();
  const fromEngine = new PassThrough();
  const conn = Duplex.from({ readable: fromEngine, writable: toEngine });
  return { conn, toEngine, fromEngine };
}

async function readAll(stream: Duplex): Promise<string> {
  let text = "";
  for await (const c of stream) text += (c as Buffer).toString("utf8");
  return text;
}

describe("docker exec channel", () => {
  it("reads only the process's stdout, keeps stderr aside, and writes raw bytes to its stdin", async () => {
    const { conn, toEngine, fromEngine } = fakeConnection();
    const ch = new ExecChannel(conn);
    const written: Buffer[] = [];
    toEngine.on("data", (c: Buffer) => written.push(c));
    ch.write(Buffer.from([0, 0, 0, 5, 1, 2, 3]));
    fromEngine.write(encodeFrame(1, "frame-one"));
    fromEngine.write(encodeFrame(2, "agent log line\n"));
    fromEngine.end(encodeFrame(1, "|frame-two"));
    expect(await readAll(ch)).toBe("frame-one|frame-two");
    expect(ch.stderrText()).toBe("agent log line\n");
    expect(ch.answered).toBe(true);
    expect(Buffer.concat(written)).toEqual(Buffer.from([0, 0, 0, 5, 1, 2, 3]));
  });

  it("half-closes the connection when the channel's writable side ends, so the process sees EOF", async () => {
    const { conn, toEngine } = fakeConnection();
    const ch = new ExecChannel(conn);
    const ended = new Promise<void>((r) => toEngine.once("end", () => r()));
    toEngine.resume();
    ch.end();
    await ended;
    expect(ch.destroyed).toBe(false);
  });

  it("fails with a framing error on a malformed frame, and on a stream cut inside a frame", async () => {
    const bad = fakeConnection();
    const ch = new ExecChannel(bad.conn);
    bad.fromEngine.end(Buffer.from("garbage-not-a-frame"));
    await expect(readAll(ch)).rejects.toBeInstanceOf(FramingError);

    const cut = fakeConnection();
    const ch2 = new ExecChannel(cut.conn);
    cut.fromEngine.end(encodeFrame(1, "truncated").subarray(0, 12));
    await expect(readAll(ch2)).rejects.toThrow(/middle of a frame/);
  });

  it("reports the process's stderr when it exits without ever answering", async () => {
    const { conn, fromEngine } = fakeConnection();
    const ch = new ExecChannel(conn);
    fromEngine.end(encodeFrame(2, "pyro-agent: --root is required\n"));
    await expect(readAll(ch)).rejects.toThrow(/exited before answering: pyro-agent: --root is required/);
  });

  it("destroys the connection when the channel is destroyed", async () => {
    const { conn } = fakeConnection();
    const ch = new ExecChannel(conn);
    const closed = new Promise<void>((r) => conn.once("close", () => r()));
    ch.destroy();
    await closed;
    expect(conn.destroyed).toBe(true);
  });
});
