/**
 * The network mux: many TCP streams over one byte stream between the host and a VM
 * (a virtio-serial port carries one session at a time), for the VM's egress and its
 * published ports (docs/network.md, docs/protocol.md "Network mux"). It reuses the
 * agent protocol's frame codec (frames.ts):
 *
 * - Messages (channel 0, JSON): `{t:"open", ch, kind:"egress"}` (guest → host: a
 *   command connected to 127.0.0.1:3128 in the guest), `{t:"open", ch, kind:"port",
 *   port}` (host → guest: dial 127.0.0.1:port in the guest), answered by `{t:"ok", ch}`
 *   or `{t:"no", ch, reason}`.
 * - Data frames carry a stream's bytes, End frames its half-close, Abort frames a reset.
 *
 * Channel numbers are odd when the host opens and even when the guest opens, so both
 * ends can open at once. Either side refuses what it does not expect (an unknown
 * channel's data is dropped with an Abort; a malformed message ends the session).
 * Backpressure: a stream's source is paused while the mux's stream is over its high-water
 * mark, so one slow reader stalls its neighbours but never grows memory without bound.
 */
import type { Duplex } from "node:stream";
import { encodeFrame, type Frame, FrameDecoder, FrameKind, MAX_FRAME_PAYLOAD } from "./frames.js";

export type MuxOpen = { kind: "egress" } | { kind: "port"; port: number };

/** What a side does with a stream the other side opens: a local socket, or a refusal. */
export type MuxAccept = (req: MuxOpen) => Promise<Duplex>;

interface Pending {
  resolve: (d: Duplex) => void;
  reject: (e: Error) => void;
  local: Duplex;
}

const MAX_STREAMS = 1024;
const MAX_CHANNEL = 0xffff_ffff;
const MAX_REASON = 200;

export class NetMux {
  private readonly decoder = new FrameDecoder();
  private readonly streams = new Map<number, Duplex>();
  private readonly pending = new Map<number, Pending>();
  /** Channels the peer opened whose accept callback has not answered yet. */
  private readonly accepting = new Set<number>();
  /** Local streams paused until the wire drains (outbound backpressure). */
  private readonly blocked = new Set<Duplex>();
  /** Local streams over their high-water mark; the wire is paused while any is (inbound). */
  private readonly stalled = new Set<Duplex>();
  private readonly peerParity: number;
  private next: number;
  private ended = false;
  readonly closed: Promise<void>;
  private resolveClosed!: () => void;

  constructor(
    private readonly wire: Duplex,
    side: "host" | "guest",
    private readonly accept: MuxAccept,
  ) {
    this.next = side === "host" ? 1 : 2;
    this.peerParity = side === "host" ? 0 : 1;
    this.closed = new Promise((r) => {
      this.resolveClosed = r;
    });
    wire.on("data", (chunk: Buffer) => this.onData(chunk));
    wire.on("close", () => this.shutdown());
    wire.on("end", () => this.shutdown());
    wire.on("error", () => this.shutdown());
    wire.on("drain", () => {
      const blocked = [...this.blocked];
      this.blocked.clear();
      for (const s of blocked) s.resume();
    });
  }

  /**
   * Opens a stream to the other side and pipes `local` through it once accepted; rejects
   * (and destroys `local`) when refused or when the session ends.
   */
  open(req: MuxOpen, local: Duplex): Promise<Duplex> {
    if (this.ended) {
      local.destroy();
      return Promise.reject(new Error("the network channel is closed"));
    }
    const ch = this.next;
    this.next += 2;
    if (this.next > 0xffff_fff0) this.next -= 0xffff_ff00;
    return new Promise<Duplex>((resolve, reject) => {
      this.pending.set(ch, { resolve, reject, local });
      local.pause();
      this.send(FrameKind.Message, 0, Buffer.from(JSON.stringify({ t: "open", ch, ...req })));
    });
  }

  close(): void {
    this.wire.destroy();
    this.shutdown();
  }

  private shutdown(): void {
    if (this.ended) return;
    this.ended = true;
    for (const s of this.streams.values()) s.destroy();
    this.streams.clear();
    this.blocked.clear();
    this.stalled.clear();
    for (const p of this.pending.values()) {
      p.local.destroy();
      p.reject(new Error("the network channel closed"));
    }
    this.pending.clear();
    this.resolveClosed();
  }

  private send(kind: FrameKind, ch: number, payload?: Buffer): boolean {
    if (this.ended) return false;
    return this.wire.write(encodeFrame(kind, ch, payload));
  }

  private onData(chunk: Buffer): void {
    let frames: Frame[];
    try {
      frames = this.decoder.push(chunk);
    } catch {
      this.close();
      return;
    }
    for (const f of frames) this.onFrame(f);
  }

  private onFrame(f: Frame): void {
    if (this.ended) return;
    if (f.kind === FrameKind.Message) {
      this.onMessage(f.payload);
      return;
    }
    if (f.channel === 0) {
      // The mux never fragments messages: data or end on channel 0 is a violation.
      this.close();
      return;
    }
    const s = this.streams.get(f.channel);
    if (!s) {
      if (f.kind !== FrameKind.Abort) this.send(FrameKind.Abort, f.channel);
      return;
    }
    if (f.kind === FrameKind.Data) {
      if (!s.write(f.payload)) this.stall(s);
    } else if (f.kind === FrameKind.End) s.end();
    else {
      this.streams.delete(f.channel);
      s.destroy();
    }
  }

  private onMessage(payload: Buffer): void {
    let m: { t?: unknown; ch?: unknown; kind?: unknown; port?: unknown; reason?: unknown };
    try {
      m = JSON.parse(payload.toString("utf8"));
    } catch {
      this.close();
      return;
    }
    if (typeof m !== "object" || m === null || Array.isArray(m)) {
      this.close();
      return;
    }
    const ch = m.ch;
    if (typeof ch !== "number" || !Number.isInteger(ch) || ch <= 0 || ch > MAX_CHANNEL) {
      this.close();
      return;
    }
    if (m.t === "open") {
      // The peer opens channels of its own parity only (odd: host, even: guest).
      if (ch % 2 !== this.peerParity) {
        this.close();
        return;
      }
      return void this.onOpen(ch, m);
    }
    const p = this.pending.get(ch);
    if (!p) return;
    this.pending.delete(ch);
    if (m.t === "ok") {
      this.attach(ch, p.local);
      p.resolve(p.local);
    } else {
      p.local.destroy();
      p.reject(new Error(typeof m.reason === "string" ? m.reason.slice(0, MAX_REASON) : "refused"));
    }
  }

  private async onOpen(ch: number, m: { kind?: unknown; port?: unknown }): Promise<void> {
    const refuse = (reason: string) =>
      this.send(
        FrameKind.Message,
        0,
        Buffer.from(JSON.stringify({ t: "no", ch, reason: reason.slice(0, MAX_REASON) })),
      );
    if (this.streams.has(ch) || this.accepting.has(ch)) return void refuse("channel in use");
    if (this.streams.size + this.accepting.size >= MAX_STREAMS) return void refuse("too many streams");
    let req: MuxOpen;
    if (m.kind === "egress") req = { kind: "egress" };
    else if (
      m.kind === "port" &&
      Number.isInteger(m.port) &&
      (m.port as number) >= 1 &&
      (m.port as number) <= 65535
    )
      req = { kind: "port", port: m.port as number };
    else return void refuse("bad open request");
    let local: Duplex;
    this.accepting.add(ch);
    try {
      local = await this.accept(req);
    } catch (err) {
      return void refuse(err instanceof Error ? err.message : String(err));
    } finally {
      this.accepting.delete(ch);
    }
    if (this.ended) return void local.destroy();
    if (local.destroyed) return void refuse("closed");
    this.attach(ch, local);
    this.send(FrameKind.Message, 0, Buffer.from(JSON.stringify({ t: "ok", ch })));
  }

  /** Pipes a local stream through channel `ch`. */
  private attach(ch: number, local: Duplex): void {
    if (local.destroyed) {
      // Closed while its open was in flight: its 'close' has already been emitted.
      this.send(FrameKind.Abort, ch);
      return;
    }
    this.streams.set(ch, local);
    let finished = false;
    local.on("data", (chunk: Buffer) => {
      let full = false;
      for (let i = 0; i < chunk.length; i += MAX_FRAME_PAYLOAD) {
        if (!this.send(FrameKind.Data, ch, chunk.subarray(i, i + MAX_FRAME_PAYLOAD))) full = true;
      }
      if (full && !this.ended) {
        local.pause();
        this.blocked.add(local);
      }
    });
    local.on("end", () => {
      finished = true;
      this.send(FrameKind.End, ch);
    });
    local.on("error", () => {});
    local.on("close", () => {
      this.blocked.delete(local);
      if (this.streams.get(ch) !== local) return;
      this.streams.delete(ch);
      if (!finished) this.send(FrameKind.Abort, ch);
    });
    local.resume();
  }

  /** Pauses the wire until `s` drains or closes (inbound backpressure). */
  private stall(s: Duplex): void {
    if (this.stalled.has(s)) return;
    this.stalled.add(s);
    this.wire.pause();
    const go = () => {
      s.off("drain", go);
      s.off("close", go);
      this.stalled.delete(s);
      if (this.stalled.size === 0 && !this.ended) this.wire.resume();
    };
    s.on("drain", go);
    s.on("close", go);
  }
}
