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
    if (options.signal?.aborted)
      throw new PyroError("cancelled", `connecting to vsock port ${port} was cancelled`);
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
    const onAbort = () =>
      settle({
        kind: "fatal",
        error: new PyroError("cancelled", `connecting to vsock port ${port} was cancelled`),
      });
    const timer = setTimeout(
      () =>
        settle({
          kind: "fatal",
          error: new PyroError(
            "timeout",
            connected
              ? `vsock port ${port} via ${udsPath}: no handshake reply within ${timeoutMs} ms`
              : `vsock port ${port}: connecting to ${udsPath} timed out`,
          ),
        }),
      timeoutMs,
    );
    const onConnect = () => {
      connected = true;
      sock.write(`CONNECT ${port}\n`);
    };
    const onReadable = () => {
      for (;;) {
        const chunk: Buffer | null = sock.read();
        if (chunk === null) return;
        buf = buf.length === 0 ? chunk : Buffer.concat([buf, chunk]);
        const nl = buf.indexOf(0x0a);
        if (nl < 0) {
          if (buf.length > MAX_LINE_BYTES) {
            settle({ kind: "fatal", error: badReply(udsPath, port, buf.subarray(0, MAX_LINE_BYTES)) });
            return;
          }
          continue;
        }
        const line = buf.subarray(0, nl);
        if (!OK_LINE.test(line.toString("latin1"))) {
          settle({ kind: "fatal", error: badReply(udsPath, port, line) });
          return;
        }
        const rest = buf.subarray(nl + 1);
        settle({ kind: "ok", socket: sock });
        // Whatever the guest sent right behind the OK line belongs to the caller.
        if (rest.length > 0) sock.unshift(rest);
        return;
      }
    };
    const onEnd = () =>
      settle({
        kind: "retry",
        reason: connected
          ? `Firecracker closed the connection: nothing listens on guest vsock port ${port} yet`
          : `${udsPath} closed before the handshake`,
      });
    const onError = (err: NodeJS.ErrnoException) => {
      // The socket file is missing or refuses until Firecracker has configured the device;
      // a reset during the handshake is Firecracker giving up on the guest port.
      if (
        err.code === "ENOENT" ||
        err.code === "ECONNREFUSED" ||
        err.code === "ECONNRESET" ||
        err.code === "EPIPE"
      )
        settle({ kind: "retry", reason: `${udsPath}: ${err.code}` });
      else
        settle({
          kind: "fatal",
          error: new PyroError(
            "backend_unavailable",
            `vsock port ${port}: cannot connect to ${udsPath}: ${err.message}`,
          ),
        });
    };
    sock.on("connect", onConnect);
    sock.on("readable", onReadable);
    sock.on("end", onEnd);
    sock.on("close", onEnd);
    sock.on("error", onError);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

function badReply(udsPath: string, port: number, line: Buffer): PyroError {
  const shown = JSON.stringify(line.toString("latin1").slice(0, MAX_LINE_BYTES));
  return new PyroError(
    "backend_unavailable",
    `vsock port ${port} via ${udsPath}: unexpected handshake reply ${shown} (expected "OK <port>")`,
  );
}
