/**
 * The network helper's listener inside the sandbox (docs/network.md, "The helper listens
 * in the sandbox"), and the control socket through which a pyro process tells the helper
 * that the workspace has a new sandbox.
 *
 * For a backend with `egressNamespace` (bwrap), the helper itself listens on
 * 127.0.0.1:EGRESS_PORT in the sandbox's network namespace (net/netns-listen.ts) and
 * hands each connection to its proxy: no relay in the agent. Every sandbox start is
 * followed by an attach (core/network.ts `attach`), before anything runs in it; the
 * helper also attaches on its own when it starts beside a running sandbox.
 *
 * Control protocol, on CTL_SOCKET in the net directory (the host's side only, mode 0600):
 * one request line `{"attach":{"pid":N,"start_time":"S"}}`, one answer line `{"ok":true}`
 * or `{"error":{code,message,hint?}}`, then the helper closes the connection.
 */
import { chmodSync, rmSync } from "node:fs";
import net from "node:net";
import { EGRESS_PORT } from "../agent/guest/net.js";
import { listen } from "../agent/pipe.js";
import { PyroError, toPyroError } from "../errors.js";
import { listenInNamespace, type NamespaceHolder, namespaceId } from "../net/netns-listen.js";

export { CTL_SOCKET } from "./netd-files.js";

/** The longest control request accepted. */
const MAX_REQUEST = 1024;

/** How long an attach may take, seen from the pyro process. */
const ATTACH_MS = 15_000;

/** The helper's one listener in the current sandbox; an attach to a new sandbox replaces it. */
export class SandboxListener {
  private current: { server: net.Server; namespace: string } | null = null;
  private queue: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly accept: (socket: net.Socket) => void,
    private readonly port = EGRESS_PORT,
  ) {}

  /** Listens in `holder`'s namespace (once: a second attach to it changes nothing). */
  attach(holder: NamespaceHolder): Promise<void> {
    const next = this.queue.then(() => this.attachNow(holder));
    this.queue = next.catch(() => {});
    return next;
  }

  private async attachNow(holder: NamespaceHolder): Promise<void> {
    const current = this.current;
    if (current && current.namespace === namespaceIdOf(holder.pid)) return;
    const { server, namespace } = await listenInNamespace(holder, this.port);
    server.on("connection", (socket) => this.accept(socket));
    server.on("error", () => {});
    this.current = { server, namespace };
    // The old sandbox is gone: its namespace lives on only through this socket.
    current?.server.close();
  }

  close(): void {
    this.current?.server.close();
    this.current = null;
  }
}

function namespaceIdOf(pid: number): string | null {
  try {
    return namespaceId(`/proc/${pid}/ns/net`);
  } catch {
    return null;
  }
}

function parseRequest(line: string): NamespaceHolder {
  let req: { attach?: { pid?: unknown; start_time?: unknown } } | null = null;
  try {
    req = JSON.parse(line);
  } catch {}
  const pid = req?.attach?.pid;
  const start = req?.attach?.start_time;
  if (!Number.isInteger(pid) || (pid as number) <= 1 || typeof start !== "string")
    throw new PyroError("invalid_argument", "bad attach request");
  return { pid: pid as number, start_time: start };
}

/** Serves the control socket at `path`; each attach request goes to `attach`. */
export async function serveControl(
  path: string,
  attach: (holder: NamespaceHolder) => Promise<void>,
): Promise<net.Server> {
  const server = net.createServer((s) => {
    let text = "";
    s.on("error", () => s.destroy());
    s.on("data", (d: Buffer) => {
      text += d.toString("utf8");
      const nl = text.indexOf("\n");
      if (nl < 0 && text.length < MAX_REQUEST) return;
      s.removeAllListeners("data");
      const answer = (body: object) => s.end(`${JSON.stringify(body)}\n`);
      let holder: NamespaceHolder;
      try {
        holder = parseRequest(text.slice(0, nl < 0 ? text.length : nl));
      } catch (err) {
        return answer({ error: toPyroError(err).toJSON() });
      }
      attach(holder).then(
        () => answer({ ok: true }),
        (err) => answer({ error: toPyroError(err).toJSON() }),
      );
    });
  });
  rmSync(path, { force: true });
  await listen(server, { path });
  chmodSync(path, 0o600);
  return server;
}

/** No helper answers on the control socket (none, or one of an older build without it). */
export class HelperUnreachable extends PyroError {}

/** Asks the helper listening on `path` to attach to `holder`'s namespace; throws its error. */
export function requestAttach(path: string, holder: NamespaceHolder, timeoutMs = ATTACH_MS): Promise<void> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ path });
    let text = "";
    const timer = setTimeout(() => {
      s.destroy();
      reject(new PyroError("backend_unavailable", "the workspace's network helper did not answer an attach"));
    }, timeoutMs);
    s.on("data", (d: Buffer) => {
      text += d.toString("utf8");
    });
    s.on("error", (err) => {
      clearTimeout(timer);
      reject(
        new HelperUnreachable(
          "backend_unavailable",
          `cannot reach the workspace's network helper: ${(err as NodeJS.ErrnoException).code ?? err.message}`,
          "the next use of the workspace starts its helper again",
        ),
      );
    });
    s.on("close", () => {
      clearTimeout(timer);
      let answer: { ok?: boolean; error?: { code: string; message: string; hint?: string } };
      try {
        answer = JSON.parse(text.trim());
      } catch {
        return reject(
          new PyroError("backend_unavailable", "the workspace's network helper closed an attach"),
        );
      }
      if (answer.ok) return resolve();
      const e = answer.error;
      reject(
        new PyroError(
          (e?.code as PyroError["code"]) ?? "backend_unavailable",
          `the workspace's network helper cannot serve the sandbox: ${e?.message ?? "no reason"}`,
          e?.hint ?? "see the helper's log (net/netd.log in the workspace's directory)",
        ),
      );
    });
    // Not end(): the helper would see the end and close before it answers.
    s.write(`${JSON.stringify({ attach: holder })}\n`);
  });
}
