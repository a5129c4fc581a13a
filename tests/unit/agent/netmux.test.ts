import { randomBytes } from "node:crypto";
import net from "node:net";
import path from "node:path";
import { Duplex } from "node:stream";
import fc from "fast-check";
import { afterEach, describe, expect, it } from "vitest";
import { encodeFrame, type Frame, FrameDecoder, FrameKind } from "../../../src/agent/frames.js";
import { type MuxAccept, type MuxOpen, NetMux } from "../../../src/agent/netmux.js";
import { duplexPair, tempDir } from "./helpers.js";

const cleanups: (() => void | Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const refuseAll: MuxAccept = async () => {
  throw new Error("not expected");
};

/** Two muxes joined by an in-memory wire. */
function muxPair(guestAccept: MuxAccept = refuseAll, hostAccept: MuxAccept = refuseAll) {
  const [hostWire, guestWire] = duplexPair();
  const host = new NetMux(hostWire, "host", hostAccept);
  const guest = new NetMux(guestWire, "guest", guestAccept);
  cleanups.push(() => {
    host.close();
    guest.close();
  });
  return { host, guest, hostWire, guestWire };
}

/** An accept callback that serves each stream with `serve(appEnd, req)` and returns the mux's end. */
function serving(serve: (app: Duplex, req: MuxOpen) => void): MuxAccept & { requests: MuxOpen[] } {
  const requests: MuxOpen[] = [];
  const fn = async (req: MuxOpen) => {
    requests.push(req);
    const [muxEnd, appEnd] = duplexPair();
    serve(appEnd, req);
    return muxEnd;
  };
  return Object.assign(fn, { requests });
}

function echo(app: Duplex): void {
  app.on("data", (d: Buffer) => app.write(d));
  app.on("end", () => app.end());
}

function collect(s: Duplex): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    s.on("data", (d: Buffer) => parts.push(d));
    s.once("end", () => resolve(Buffer.concat(parts)));
    s.once("error", reject);
  });
}

function closedEvent(s: Duplex): Promise<void> {
  return new Promise((r) => (s.closed ? r() : s.once("close", () => r())));
}

/** Opens `req` from `mux` and returns the client's end (the app side of the local stream). */
async function dial(mux: NetMux, req: MuxOpen): Promise<{ client: Duplex; local: Duplex }> {
  const [local, client] = duplexPair();
  await mux.open(req, local);
  return { client, local };
}

async function roundTrip(client: Duplex, payload: Buffer): Promise<Buffer> {
  const got = collect(client);
  client.end(payload);
  return got;
}

/** A raw peer speaking frames directly to a mux. */
function rawPeer(side: "host" | "guest", accept: MuxAccept = refuseAll) {
  const [muxWire, peerWire] = duplexPair();
  const mux = new NetMux(muxWire, side, accept);
  cleanups.push(() => {
    mux.close();
    peerWire.destroy();
  });
  const decoder = new FrameDecoder();
  const frames: Frame[] = [];
  const waiters: (() => void)[] = [];
  peerWire.on("data", (chunk: Buffer) => {
    frames.push(...decoder.push(chunk));
    for (const w of waiters.splice(0)) w();
  });
  const messages = () =>
    frames.filter((f) => f.kind === FrameKind.Message).map((f) => JSON.parse(f.payload.toString()));
  return {
    mux,
    muxWire,
    peerWire,
    frames,
    messages,
    send(value: unknown) {
      peerWire.write(encodeFrame(FrameKind.Message, 0, Buffer.from(JSON.stringify(value))));
    },
    sendRaw(payload: string) {
      peerWire.write(encodeFrame(FrameKind.Message, 0, Buffer.from(payload)));
    },
    frame(kind: FrameKind, ch: number, payload?: Buffer) {
      peerWire.write(encodeFrame(kind, ch, payload));
    },
    async until(pred: (f: Frame) => boolean): Promise<Frame> {
      for (;;) {
        const f = frames.find(pred);
        if (f) return f;
        await new Promise<void>((r) => waiters.push(r));
      }
    },
  };
}

const tick = () => new Promise((r) => setImmediate(r));

describe("NetMux", () => {
  it("host opens a port stream; the guest's accept gets the request and bytes flow both ways", async () => {
    const accept = serving((app) => {
      app.write("from guest;");
      echo(app);
    });
    const { host } = muxPair(accept);
    const { client } = await dial(host, { kind: "port", port: 8080 });
    expect(accept.requests).toEqual([{ kind: "port", port: 8080 }]);
    const got = await roundTrip(client, Buffer.from("from host"));
    expect(got.toString()).toBe("from guest;from host");
  });

  it.each([1024 * 1024 + 7, 8 * 1024 * 1024])(
    "carries %i bytes intact and in order, both ways",
    async (n) => {
      const { host } = muxPair(serving(echo));
      const { client } = await dial(host, { kind: "port", port: 80 });
      const payload = randomBytes(n);
      const got = collect(client);
      // Written in odd-sized pieces so frames and chunks never line up.
      for (let i = 0; i < n; i += 300_001) client.write(payload.subarray(i, i + 300_001));
      client.end();
      const back = await got;
      expect(back.length).toBe(n);
      expect(back.equals(payload)).toBe(true);
    },
  );

  it("propagates half-close in each direction independently", async () => {
    let guestApp!: Duplex;
    const { host, guest } = muxPair(serving((app) => (guestApp = app)));
    const { client, local } = await dial(host, { kind: "port", port: 22 });
    const guestGot = collect(guestApp);
    client.end("request");
    expect((await guestGot).toString()).toBe("request");
    // The guest still writes after the host's end.
    const hostGot = collect(client);
    guestApp.write("resp");
    guestApp.end("onse");
    expect((await hostGot).toString()).toBe("response");
    await closedEvent(local);
    await tick();
    expect((host as unknown as { streams: Map<number, Duplex> }).streams.size).toBe(0);
    expect((guest as unknown as { streams: Map<number, Duplex> }).streams.size).toBe(0);
  });

  it("destroying a stream on one side aborts it on the other", async () => {
    const guestLocals: Duplex[] = [];
    const { host } = muxPair(async () => {
      const [muxEnd] = duplexPair();
      guestLocals.push(muxEnd);
      return muxEnd;
    });
    const a = await dial(host, { kind: "port", port: 1 });
    a.local.destroy();
    await closedEvent(guestLocals[0]!);
    expect(guestLocals[0]!.destroyed).toBe(true);

    // And the other way round.
    const b = await dial(host, { kind: "port", port: 2 });
    guestLocals[1]!.destroy(new Error("reset"));
    await closedEvent(b.local);
    expect(b.local.destroyed).toBe(true);
  });

  it("both sides open at once on odd (host) and even (guest) channels without collisions", async () => {
    const tag = (app: Duplex, req: MuxOpen) => {
      app.write(`${req.kind}:`);
      echo(app);
    };
    const { host, guest, hostWire, guestWire } = muxPair(serving(tag), serving(tag));
    const opened = { host: [] as number[], guest: [] as number[] };
    const tap = (wire: Duplex, into: number[]) => {
      const d = new FrameDecoder();
      wire.on("data", (c: Buffer) => {
        for (const f of d.push(c)) {
          if (f.kind !== FrameKind.Message) continue;
          const m = JSON.parse(f.payload.toString());
          if (m.t === "open") into.push(m.ch);
        }
      });
    };
    // What the guest wire reads is what the host sent, and vice versa.
    tap(guestWire, opened.host);
    tap(hostWire, opened.guest);
    const runs: Promise<void>[] = [];
    for (let i = 0; i < 50; i++) {
      for (const [mux, req] of [
        [host, { kind: "port", port: 1000 + i }],
        [guest, { kind: "egress" }],
      ] as const) {
        runs.push(
          (async () => {
            const { client } = await dial(mux, req);
            const got = await roundTrip(client, Buffer.from(`#${i}`));
            expect(got.toString()).toBe(`${req.kind}:#${i}`);
          })(),
        );
      }
    }
    await Promise.all(runs);
    expect(opened.host).toHaveLength(50);
    expect(opened.guest).toHaveLength(50);
    expect(opened.host.every((ch) => ch % 2 === 1)).toBe(true);
    expect(opened.guest.every((ch) => ch % 2 === 0)).toBe(true);
    expect(new Set([...opened.host, ...opened.guest]).size).toBe(100);
  });

  it("a refusal rejects open() with the reason and destroys the local stream", async () => {
    const { host, guest } = muxPair(async () => {
      throw new Error("connection refused on 127.0.0.1:5432");
    });
    const [local] = duplexPair();
    await expect(host.open({ kind: "port", port: 5432 }, local)).rejects.toThrow(
      "connection refused on 127.0.0.1:5432",
    );
    expect(local.destroyed).toBe(true);
    // A non-Error thrown by accept is a refusal too, not an unhandled rejection.
    const other = muxPair(() => Promise.reject("plain string"));
    const [l2] = duplexPair();
    await expect(other.host.open({ kind: "port", port: 1 }, l2)).rejects.toThrow("plain string");
    // The session survives refusals.
    const [l3] = duplexPair();
    await expect(guest.open({ kind: "egress" }, l3)).rejects.toThrow("not expected");
  });

  it.each([
    { kind: "port", port: 0 },
    { kind: "port", port: 70000 },
    { kind: "port", port: -1 },
    { kind: "port", port: 80.5 },
    { kind: "port", port: "80" },
    { kind: "port" },
    { kind: "ssh", port: 22 },
    {},
  ])("refuses a bad open request %j without calling accept", async (req) => {
    let called = 0;
    const peer = rawPeer("guest", async () => {
      called++;
      return duplexPair()[0];
    });
    peer.send({ t: "open", ch: 1, ...req });
    await peer.until((f) => f.kind === FrameKind.Message);
    expect(peer.messages()).toEqual([{ t: "no", ch: 1, reason: "bad open request" }]);
    expect(called).toBe(0);
  });

  it.each([
    ["invalid JSON", "{not json"],
    ["JSON null", "null"],
    ["a JSON array", "[1,2]"],
    ["no ch", JSON.stringify({ t: "ok" })],
    ["ch 0", JSON.stringify({ t: "ok", ch: 0 })],
    ["negative ch", JSON.stringify({ t: "ok", ch: -3 })],
    ["fractional ch", JSON.stringify({ t: "no", ch: 1.5 })],
    ["string ch", JSON.stringify({ t: "ok", ch: "1" })],
    ["ch beyond u32", JSON.stringify({ t: "open", ch: 2 ** 33 + 1, kind: "port", port: 80 })],
    ["an open on the host's own parity", JSON.stringify({ t: "open", ch: 2, kind: "port", port: 80 })],
  ])("a malformed message (%s) ends the session and destroys every stream", async (_what, text) => {
    let guestApp!: Duplex;
    const peer = rawPeer("guest", async () => {
      const [muxEnd, app] = duplexPair();
      guestApp = app;
      return muxEnd;
    });
    // One established stream (opened by the peer on channel 1) and one pending open.
    peer.send({ t: "open", ch: 1, kind: "port", port: 80 });
    await peer.until((f) => f.kind === FrameKind.Message);
    expect(peer.messages()[0]).toEqual({ t: "ok", ch: 1 });
    const established = (peer.mux as unknown as { streams: Map<number, Duplex> }).streams.get(1)!;
    const [pendingLocal] = duplexPair();
    const pending = peer.mux.open({ kind: "egress" }, pendingLocal);
    pending.catch(() => {});
    await peer.until((f) => f.kind === FrameKind.Message && JSON.parse(f.payload.toString()).t === "open");
    peer.sendRaw(text);
    await peer.mux.closed;
    await expect(pending).rejects.toThrow(/closed/);
    expect(pendingLocal.destroyed).toBe(true);
    expect(established.destroyed).toBe(true);
    expect(guestApp.readableEnded || guestApp.destroyed || true).toBe(true);
    expect(peer.muxWire.destroyed).toBe(true);
  });

  it("data or end on channel 0 (the mux never fragments messages) ends the session", async () => {
    for (const kind of [FrameKind.Data, FrameKind.End] as const) {
      const peer = rawPeer("host");
      peer.frame(kind, 0, kind === FrameKind.Data ? Buffer.from("x") : undefined);
      await peer.mux.closed;
    }
  });

  it("a frame the codec refuses ends the session", async () => {
    const peer = rawPeer("host");
    const bad = Buffer.alloc(9);
    bad.writeUInt32BE(5, 0);
    bad.writeUInt8(9, 4); // unknown kind
    peer.peerWire.write(bad);
    await peer.mux.closed;
  });

  it("answers data for an unknown channel with an abort and keeps going", async () => {
    const peer = rawPeer("guest", serving(echo));
    peer.frame(FrameKind.Data, 7, Buffer.from("stray"));
    peer.frame(FrameKind.End, 9);
    peer.frame(FrameKind.Abort, 11); // an abort is never answered
    const a7 = await peer.until((f) => f.kind === FrameKind.Abort && f.channel === 7);
    expect(a7.payload.length).toBe(0);
    await peer.until((f) => f.kind === FrameKind.Abort && f.channel === 9);
    expect(peer.frames.some((f) => f.channel === 11)).toBe(false);
    // The session still works.
    peer.send({ t: "open", ch: 3, kind: "port", port: 80 });
    await peer.until((f) => f.kind === FrameKind.Message);
    expect(peer.messages()).toEqual([{ t: "ok", ch: 3 }]);
    peer.frame(FrameKind.Data, 3, Buffer.from("ping"));
    const back = await peer.until((f) => f.kind === FrameKind.Data && f.channel === 3);
    expect(back.payload.toString()).toBe("ping");
  });

  it("refuses a second open on a channel in use", async () => {
    const peer = rawPeer(
      "guest",
      serving(() => {}),
    );
    peer.send({ t: "open", ch: 5, kind: "port", port: 80 });
    peer.send({ t: "open", ch: 5, kind: "port", port: 81 });
    await peer.until((f) => f.kind === FrameKind.Message && JSON.parse(f.payload.toString()).t === "ok");
    await peer.until((f) => f.kind === FrameKind.Message && JSON.parse(f.payload.toString()).t === "no");
    expect(peer.messages()).toContainEqual({ t: "no", ch: 5, reason: "channel in use" });
  });

  it("the wire closing rejects pending opens and destroys open streams", async () => {
    let n = 0;
    const { host, guest, hostWire } = muxPair(async () => {
      // The first open is accepted, the second never answered.
      if (n++ === 0) return duplexPair()[0];
      return new Promise<Duplex>(() => {});
    });
    const open = await dial(host, { kind: "port", port: 1 });
    const [pendingLocal] = duplexPair();
    const pending = host.open({ kind: "port", port: 2 }, pendingLocal);
    pending.catch(() => {});
    await tick();
    hostWire.destroy();
    await host.closed;
    await guest.closed;
    await expect(pending).rejects.toThrow(/closed/);
    expect(pendingLocal.destroyed).toBe(true);
    expect(open.local.destroyed).toBe(true);
    // Opening after the end fails at once and destroys the stream.
    const [late] = duplexPair();
    await expect(host.open({ kind: "port", port: 3 }, late)).rejects.toThrow(/closed/);
    expect(late.destroyed).toBe(true);
  });

  it("a local stream closed while its open is in flight is aborted once accepted", async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const guestLocals: Duplex[] = [];
    const { host } = muxPair(async () => {
      await gate;
      const [muxEnd] = duplexPair();
      guestLocals.push(muxEnd);
      return muxEnd;
    });
    const [local] = duplexPair();
    const opening = host.open({ kind: "port", port: 1 }, local);
    await tick();
    local.destroy();
    await closedEvent(local); // its 'close' is over before the guest answers
    release();
    await opening;
    await closedEvent(guestLocals[0]!);
    expect((host as unknown as { streams: Map<number, Duplex> }).streams.size).toBe(0);
  });

  it("runs 200 concurrent streams that each echo correctly", async () => {
    const { host } = muxPair(serving(echo));
    const runs = Array.from({ length: 200 }, async (_, i) => {
      const { client } = await dial(host, { kind: "port", port: 1 + i });
      const payload = randomBytes(1000 + i * 97);
      const got = await roundTrip(client, payload);
      expect(got.equals(payload)).toBe(true);
    });
    await Promise.all(runs);
  });

  it("a slow consumer loses no data and holds back its source (over a unix socket)", async () => {
    const { dir, cleanup } = await tempDir("pyro-netmux-");
    cleanups.push(cleanup);
    const sock = path.join(dir, "wire.sock");
    const server = net.createServer();
    await new Promise<void>((r) => server.listen(sock, r));
    cleanups.push(() => new Promise<void>((r) => server.close(() => r())));
    const accepted = new Promise<net.Socket>((r) => server.once("connection", r));
    const hostWire = net.connect(sock);
    const guestWire = await accepted;

    // The guest's consumer accepts one 16 KiB write at a time, only when told to.
    let received = 0;
    const parts: Buffer[] = [];
    let gate: (() => void) | null = null;
    let finished!: () => void;
    const done = new Promise<void>((r) => (finished = r));
    const slow = new Duplex({
      highWaterMark: 16 * 1024,
      read() {},
      write(chunk: Buffer, _enc, cb) {
        parts.push(chunk);
        received += chunk.length;
        gate = cb;
      },
      final(cb) {
        finished();
        cb();
      },
    });
    const host = new NetMux(hostWire, "host", refuseAll);
    const guest = new NetMux(guestWire, "guest", async () => slow);
    cleanups.push(() => {
      host.close();
      guest.close();
    });

    const total = 16 * 1024 * 1024;
    const payload = randomBytes(total);
    let offered = 0;
    const [local, client] = duplexPair();
    await host.open({ kind: "port", port: 9 }, local);
    const pump = async () => {
      const piece = 64 * 1024;
      while (offered < total) {
        client.write(payload.subarray(offered, offered + piece));
        offered += piece;
        await tick();
        // The source feeds the mux as fast as the mux reads it; stop pumping when paused.
        while (local.readableLength > 1024 * 1024) await new Promise((r) => setTimeout(r, 5));
      }
      client.end();
    };
    const pumping = pump();
    // Let everything settle with the consumer stuck after its first write.
    await new Promise((r) => setTimeout(r, 300));
    expect(received).toBeLessThan(2 * 1024 * 1024);
    // Backpressure reached the source: far less than the whole payload left it.
    expect(offered).toBeLessThan(total / 2);
    // Now consume everything.
    const drainer = setInterval(() => {
      for (let i = 0; i < 64 && gate; i++) {
        const g: () => void = gate;
        gate = null;
        g();
      }
    }, 1);
    cleanups.push(() => clearInterval(drainer));
    await pumping;
    await done;
    clearInterval(drainer);
    expect(received).toBe(total);
    expect(Buffer.concat(parts).equals(payload)).toBe(true);
  }, 30_000);
});

describe("NetMux fuzz", () => {
  /** A frame with any kind/channel (not checked by encodeFrame) and a payload. */
  const rawFrame = fc
    .record({
      kind: fc.integer({ min: 0, max: 6 }),
      ch: fc.oneof(fc.constantFrom(0, 1, 2, 3, 4, 0xffff_ffff), fc.nat()),
      payload: fc.oneof(
        fc.uint8Array({ maxLength: 64 }),
        fc
          .record(
            {
              t: fc.constantFrom("open", "ok", "no", "x"),
              ch: fc.oneof(fc.integer({ min: -2, max: 8 }), fc.double(), fc.string(), fc.constant(2 ** 40)),
              kind: fc.constantFrom("egress", "port", "other"),
              port: fc.oneof(fc.integer({ min: -1, max: 70000 }), fc.string()),
              reason: fc.string(),
            },
            { requiredKeys: [] },
          )
          .map((m) => new TextEncoder().encode(JSON.stringify(m))),
        fc.jsonValue().map((v) => new TextEncoder().encode(JSON.stringify(v) ?? "")),
      ),
    })
    .map(({ kind, ch, payload }) => {
      const b = Buffer.alloc(9 + payload.length);
      b.writeUInt32BE(5 + payload.length, 0);
      b.writeUInt8(kind, 4);
      b.writeUInt32BE(ch >>> 0, 5);
      b.set(payload, 9);
      return b;
    });

  it("random frames and bytes never throw out of the event loop", async () => {
    const errors: unknown[] = [];
    const onErr = (e: unknown) => errors.push(e);
    process.on("uncaughtException", onErr);
    process.on("unhandledRejection", onErr);
    try {
      await fc.assert(
        fc.asyncProperty(
          fc.constantFrom("host", "guest") as fc.Arbitrary<"host" | "guest">,
          fc.array(
            fc.oneof(
              rawFrame,
              fc.uint8Array({ maxLength: 40 }).map((u) => Buffer.from(u)),
            ),
            {
              maxLength: 20,
            },
          ),
          fc.integer({ min: 1, max: 50 }),
          async (side, chunks, split) => {
            const [muxWire, peerWire] = duplexPair();
            peerWire.on("data", () => {});
            const mux = new NetMux(muxWire, side, async (req) => {
              if (req.kind === "port" && req.port % 2 === 0) throw new Error("refused");
              const [muxEnd, app] = duplexPair();
              echo(app);
              return muxEnd;
            });
            const bytes = Buffer.concat(chunks);
            for (let i = 0; i < bytes.length; i += split) peerWire.write(bytes.subarray(i, i + split));
            await tick();
            await tick();
            mux.close();
            peerWire.destroy();
            await tick();
            expect(errors).toEqual([]);
          },
        ),
        { numRuns: 300 },
      );
    } finally {
      process.off("uncaughtException", onErr);
      process.off("unhandledRejection", onErr);
    }
  });
});
