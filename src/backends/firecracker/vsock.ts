import { connect as netConnect, type Socket } from "node:net";
import { PyroError } from "../../errors.js";
import { withSocketPath } from "../sockpath.js";

/**
 * The host side of Firecracker's vsock device (docs/vsock.md upstream): connect to the
 * device's unix socket (`uds_path`), send `CONNECT <port>\n`, and Firecracker answers
 * `OK <host port>\n` once a guest process accepted on that vsock port. When nothing
 * listens on the guest port yet, Firecracker closes the connection instead; that is
 * retried until the deadline.
 */

export interface VsockConnectOptions {
  /** Overall deadline, retries included. */
  timeoutMs: number;
  signal?: AbortSignal;
  /** First pause between attempts (doubles up to 200 ms). */
  retryDelayMs?: number;
}

/** Longest acceptable handshake line ("OK " + a u32 port): anything longer is not Firecracker. */
const MAX_LINE_BYTES = 64;
const OK_LINE = /^OK \d{1,10}$/;

type Attempt =
  | { kind: "ok"; socket: Socket }
  | { kind: "retry"; reason: string }
  | { kind: "fatal"; error: PyroError };

/**
 * A byte stream to guest vsock `port` through Firecracker's socket at `udsPath`. Bytes
 * the guest sent right after the handshake line are kept (pushed back into the stream).
 */
export async function connectVsock(
  udsPath: string,
  port: number,
  options: VsockConnectOptions,
): Promise<Socket> {
  const deadline = Date.now() + options.timeoutMs;
  let delay = options.retryDelayMs ?? 20;
  let reason = "no attempt finished";
  for (;;) {
    if (options.signal?.aborted) throw cancelledError(port);
    const remaining = deadline - Date.now();
    if (remaining <= 0) {
      throw new PyroError(
        "timeout",
        `vsock port ${port} via ${udsPath} did not accept a connection within ${options.timeoutMs} ms (${reason})`,
      );
    }
    const attempt = await withSocketPath(udsPath, (usable) =>
      handshake(usable, udsPath, port, remaining, options.signal),
    );
    if (attempt.kind === "ok") return attempt.socket;
    if (attempt.kind === "fatal") throw attempt.error;
    reason = attempt.reason;
    await new Promise((r) => setTimeout(r, Math.max(0, Math.min(delay, deadline - Date.now()))));
    delay = Math.min(delay * 2, 200);
  }
}

/**
 * One attempt: connect to `connectPath` (the usable spelling of `udsPath`), send the
 * CONNECT line and read the reply line. Every way it ends (reply, close, error, timeout,
 * abort) settles it once and removes every listener; a socket not handed back is destroyed.
 */
function handshake(
  connectPath: string,
  udsPath: string,
  port: number,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<Attempt> {
  return new Promise((resolve) => {
    const sock = netConnect({ path: connectPath });
    let buf: Buffer = Buffer.alloc(0);
    let connected = false;
    let settled = false;
    const settle = (a: Attempt) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      sock.off("connect", onConnect);
      sock.off("readable", onReadable);
      sock.off("end", onEnd);
      sock.off("close", onEnd);
      sock.off("error", onError);
      if (a.kind !== "ok") sock.destroy();
      resolve(a);
    };
    const onAbort = () => settle({ kind: "fatal", error: cancelledError(port) });
    const timer = setTimeout(() => settle(timedOut(connected, udsPath, port, timeoutMs)), timeoutMs);
    const onConnect = () => {
      connected = true;
      sock.write(`CONNECT ${port}\n`);
    };
    const onReadable = () => {
      for (let chunk: Buffer | null = sock.read(); chunk !== null; chunk = sock.read()) {
        buf = buf.length === 0 ? chunk : Buffer.concat([buf, chunk]);
        const reply = parseReply(buf);
        if (reply.kind === "more") continue;
        if (reply.kind === "bad")
          return settle({ kind: "fatal", error: badReply(udsPath, port, reply.line) });
        settle({ kind: "ok", socket: sock });
        // Whatever the guest sent right behind the OK line belongs to the caller.
        if (reply.rest.length > 0) sock.unshift(reply.rest);
        return;
      }
    };
    const onEnd = () => settle(closed(connected, udsPath, port));
    const onError = (err: NodeJS.ErrnoException) => settle(failed(err, udsPath, port));
    sock.on("connect", onConnect);
    sock.on("readable", onReadable);
    sock.on("end", onEnd);
    sock.on("close", onEnd);
    sock.on("error", onError);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** What the bytes read so far say: wait for more, the OK line (and what followed it), or a bad reply. */
type Reply = { kind: "more" } | { kind: "ok"; rest: Buffer } | { kind: "bad"; line: Buffer };

function parseReply(buf: Buffer): Reply {
  const nl = buf.indexOf(0x0a);
  if (nl < 0)
    return buf.length > MAX_LINE_BYTES
      ? { kind: "bad", line: buf.subarray(0, MAX_LINE_BYTES) }
      : { kind: "more" };
  const line = buf.subarray(0, nl);
  if (!OK_LINE.test(line.toString("latin1"))) return { kind: "bad", line };
  return { kind: "ok", rest: buf.subarray(nl + 1) };
}

function cancelledError(port: number): PyroError {
  return new PyroError("cancelled", `connecting to vsock port ${port} was cancelled`);
}

function timedOut(connected: boolean, udsPath: string, port: number, timeoutMs: number): Attempt {
  return {
    kind: "fatal",
    error: new PyroError(
      "timeout",
      connected
        ? `vsock port ${port} via ${udsPath}: no handshake reply within ${timeoutMs} ms`
        : `vsock port ${port}: connecting to ${udsPath} timed out`,
    ),
  };
}

/** The connection closed before a reply: Firecracker found nothing listening on the guest port yet. */
function closed(connected: boolean, udsPath: string, port: number): Attempt {
  return {
    kind: "retry",
    reason: connected
      ? `Firecracker closed the connection: nothing listens on guest vsock port ${port} yet`
      : `${udsPath} closed before the handshake`,
  };
}

/**
 * A socket error: the socket file is missing or refuses until Firecracker has configured
 * the device, and a reset during the handshake is Firecracker giving up on the guest
 * port (both retried); anything else is fatal.
 */
function failed(err: NodeJS.ErrnoException, udsPath: string, port: number): Attempt {
  if (
    err.code === "ENOENT" ||
    err.code === "ECONNREFUSED" ||
    err.code === "ECONNRESET" ||
    err.code === "EPIPE"
  )
    return { kind: "retry", reason: `${udsPath}: ${err.code}` };
  return {
    kind: "fatal",
    error: new PyroError(
      "backend_unavailable",
      `vsock port ${port}: cannot connect to ${udsPath}: ${err.message}`,
    ),
  };
}

function badReply(udsPath: string, port: number, line: Buffer): PyroError {
  const shown = JSON.stringify(line.toString("latin1").slice(0, MAX_LINE_BYTES));
  return new PyroError(
    "backend_unavailable",
    `vsock port ${port} via ${udsPath}: unexpected handshake reply ${shown} (expected "OK <port>")`,
  );
}
