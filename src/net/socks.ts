import type { Socket } from "node:net";
import type { Destination, Refusal } from "./gate.js";

/**
 * The SOCKS5 handshake (RFC 1928), server side: no-auth only, CONNECT only.
 *
 * The codec is separate from the sockets: `readGreeting`/`readRequest` pull bytes
 * from a `ByteReader` and throw on anything malformed; the proxy then closes the
 * connection. Nothing is answered before the request is fully parsed.
 */

export const SOCKS_VERSION = 0x05;

/** Reply codes we use (RFC 1928 §6). */
export const REPLY = {
  succeeded: 0x00,
  generalFailure: 0x01,
  notAllowed: 0x02,
  hostUnreachable: 0x04,
  refused: 0x05,
  commandNotSupported: 0x07,
  addressTypeNotSupported: 0x08,
} as const;

export class SocksProtocolError extends Error {
  /** A reply to send before closing, when the request got far enough to deserve one. */
  constructor(
    message: string,
    readonly reply?: number,
  ) {
    super(message);
  }
}

/**
 * Buffers a socket's bytes until a parser asks for them; rejects on end, close or
 * timeout. `detach` hands back what was read past the handshake (optimistic data).
 */
export class ByteReader {
  private buffered = Buffer.alloc(0);
  private waiter: { n: number; resolve: (b: Buffer) => void; reject: (e: Error) => void } | null = null;
  private failed: Error | null = null;
  private readonly onData = (chunk: Buffer) => {
    this.buffered = Buffer.concat([this.buffered, chunk]);
    if (this.buffered.length > 1024) this.fail(new SocksProtocolError("handshake too large"));
    this.settle();
  };
  private readonly onGone = () => this.fail(new SocksProtocolError("client went away"));
  private readonly timer: NodeJS.Timeout;

  constructor(
    private readonly socket: Socket,
    timeoutMs: number,
  ) {
    socket.on("data", this.onData);
    socket.once("end", this.onGone);
    socket.once("close", this.onGone);
    this.timer = setTimeout(() => this.fail(new SocksProtocolError("handshake timed out")), timeoutMs);
    socket.resume();
  }

  read(n: number): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      this.waiter = { n, resolve, reject };
      this.settle();
    });
  }

  /** Stops listening (socket paused) and returns unread bytes. */
  detach(): Buffer {
    clearTimeout(this.timer);
    this.socket.pause();
    this.socket.removeListener("data", this.onData);
    this.socket.removeListener("end", this.onGone);
    this.socket.removeListener("close", this.onGone);
    const rest = this.buffered;
    this.buffered = Buffer.alloc(0);
    return rest;
  }

  private fail(err: Error): void {
    this.failed ??= err;
    this.settle();
  }

  private settle(): void {
    const w = this.waiter;
    if (!w) return;
    if (this.buffered.length >= w.n) {
      this.waiter = null;
      const out = this.buffered.subarray(0, w.n);
      this.buffered = this.buffered.subarray(w.n);
      w.resolve(out);
    } else if (this.failed) {
      this.waiter = null;
      w.reject(this.failed);
    }
  }
}

/** Reads the method-selection message; true when the client offers "no authentication". */
export async function readGreeting(reader: ByteReader): Promise<boolean> {
  const [version, count] = await reader.read(2);
  if (version !== SOCKS_VERSION) throw new SocksProtocolError("not SOCKS5");
  if (count === 0) throw new SocksProtocolError("no methods offered");
  const methods = await reader.read(count!);
  return methods.includes(0x00);
}

/** Reads a CONNECT request and returns its destination. */
export async function readRequest(reader: ByteReader): Promise<Destination> {
  const [version, command, , atyp] = await reader.read(4);
  if (version !== SOCKS_VERSION) throw new SocksProtocolError("bad request version", REPLY.generalFailure);
  let host: string;
  if (atyp === 0x01) host = [...(await reader.read(4))].join(".");
  else if (atyp === 0x04) host = formatV6(await reader.read(16));
  else if (atyp === 0x03) {
    const [length] = await reader.read(1);
    if (length === 0) throw new SocksProtocolError("empty domain name", REPLY.generalFailure);
    host = (await reader.read(length!)).toString("latin1");
  } else throw new SocksProtocolError("unknown address type", REPLY.addressTypeNotSupported);
  const port = (await reader.read(2)).readUInt16BE(0);
  // The whole request is read before answering, so the reply lands on a clean stream.
  if (command !== 0x01) throw new SocksProtocolError("only CONNECT is supported", REPLY.commandNotSupported);
  return { host, port };
}

/** A reply with an all-zero IPv4 bound address: clients of a CONNECT proxy do not use it. */
export function reply(code: number): Buffer {
  return Buffer.from([SOCKS_VERSION, code, 0x00, 0x01, 0, 0, 0, 0, 0, 0]);
}

/** The method-selection answer: no-auth, or "no acceptable methods". */
export function methodReply(acceptable: boolean): Buffer {
  return Buffer.from([SOCKS_VERSION, acceptable ? 0x00 : 0xff]);
}

export function replyFor(refusal: Refusal): number {
  switch (refusal) {
    case "blocked":
      return REPLY.notAllowed;
    case "unresolvable":
      return REPLY.hostUnreachable;
    case "unreachable":
      return REPLY.refused;
    case "bad_target":
      return REPLY.generalFailure;
  }
}

function formatV6(bytes: Buffer): string {
  const parts: string[] = [];
  for (let i = 0; i < 16; i += 2) parts.push(bytes.readUInt16BE(i).toString(16));
  return parts.join(":");
}
