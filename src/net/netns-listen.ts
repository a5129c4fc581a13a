/**
 * A listening TCP socket on 127.0.0.1 inside another process's network namespace, owned
 * by this process (docs/network.md, "The helper listens in the sandbox").
 *
 * Node cannot enter a namespace itself, so a short-lived child does it: this process
 * opens `/proc/PID/ns/net`, checks that PID is still the process it was told of (its
 * start time) and that the namespace is not its own, and starts
 *
 *   nsenter --net=/proc/self/fd/3 node -e LISTEN
 *
 * with that namespace as the child's fd 3 and an `ipc` channel. The child binds, sends
 * the listening server over the channel (`process.send(msg, server)`) and exits; this
 * process then accepts the namespace's connections itself. The child runs this host's
 * node on this host's files: only its network namespace is the sandbox's, and it only
 * ever binds one loopback port there.
 */
import { spawn } from "node:child_process";
import { closeSync, fstatSync, openSync, statSync } from "node:fs";
import type net from "node:net";
import { procStartTime } from "../backends/common.js";
import { PyroError } from "../errors.js";

/** A process that lives in the namespace: its pid and its start time (`/proc/PID/stat`). */
export interface NamespaceHolder {
  pid: number;
  start_time: string;
}

/** How long the child may take to start, bind and hand the server over. */
const LISTEN_MS = 10_000;

const CHILD = `
const s = require("node:net").createServer({ pauseOnConnect: true });
const port = Number(process.argv[1]);
s.on("error", (e) => process.send({ error: String(e.code || e.message) }, () => process.exit(1)));
s.listen({ host: "127.0.0.1", port, exclusive: true }, () => process.send({ ok: true }, s, () => process.exit(0)));
`;

/** The namespace's inode (what identifies it), as `stat` reports it for its /proc file. */
export function namespaceId(path: string): string {
  const s = statSync(path);
  return `${s.dev}:${s.ino}`;
}

/**
 * Opens the namespace of `holder` and checks it: the process is the one recorded (not a
 * reused pid) and the namespace is not this process's own (fail closed: the listener must
 * never land in the host's namespace). Returns the open descriptor and the namespace's id.
 */
async function openNamespace(holder: NamespaceHolder): Promise<{ fd: number; id: string }> {
  let fd: number;
  try {
    fd = openSync(`/proc/${holder.pid}/ns/net`, "r");
  } catch (err) {
    throw new PyroError(
      "backend_unavailable",
      `the sandbox's process ${holder.pid} is gone (${(err as NodeJS.ErrnoException).code ?? "unreadable"})`,
    );
  }
  try {
    if ((await procStartTime(holder.pid)) !== holder.start_time)
      throw new PyroError(
        "backend_unavailable",
        `the sandbox's process ${holder.pid} is gone (its pid was reused)`,
      );
    const s = fstatSync(fd);
    const id = `${s.dev}:${s.ino}`;
    if (id === namespaceId("/proc/self/ns/net"))
      throw new PyroError(
        "backend_unavailable",
        `process ${holder.pid} shares the host's network namespace: refusing to listen there`,
      );
    return { fd, id };
  } catch (err) {
    closeSync(fd);
    throw err;
  }
}

/**
 * Listens on 127.0.0.1:`port` in the network namespace of `holder`; the server (already
 * listening, connections paused until read) and the namespace's id. Fails with
 * `backend_unavailable` when the process is gone, the namespace is this process's own,
 * or the port is taken there.
 */
export async function listenInNamespace(
  holder: NamespaceHolder,
  port: number,
): Promise<{ server: net.Server; namespace: string }> {
  const { fd, id } = await openNamespace(holder);
  try {
    const server = await new Promise<net.Server>((resolve, reject) => {
      const child = spawn("nsenter", ["--net=/proc/self/fd/3", process.execPath, "-e", CHILD, String(port)], {
        stdio: ["ignore", "ignore", "pipe", fd, "ipc"],
        env: { PATH: process.env.PATH ?? "/usr/sbin:/usr/bin:/sbin:/bin" },
      });
      let stderr = "";
      child.stderr?.on("data", (d: Buffer) => {
        if (stderr.length < 2000) stderr += d.toString("utf8");
      });
      const fail = (why: string) => {
        clearTimeout(timer);
        child.kill("SIGKILL");
        reject(
          new PyroError(
            "backend_unavailable",
            `cannot listen on 127.0.0.1:${port} in the sandbox: ${why}`,
            why === "EADDRINUSE"
              ? `a process in the workspace holds port ${port}, the proxy's: end it (with the network policy off), or restart the workspace (stop, then start)`
              : undefined,
          ),
        );
      };
      const timer = setTimeout(() => fail(`no answer in ${LISTEN_MS / 1000} s`), LISTEN_MS);
      child.on("error", (err) => fail(`nsenter: ${err.message}`));
      child.on("message", (msg: { ok?: boolean; error?: string }, handle?: unknown) => {
        if (msg?.ok && handle) {
          clearTimeout(timer);
          resolve(handle as net.Server);
        } else fail(msg?.error ?? "no server");
      });
      child.on("close", (code) => fail(`exit ${code}: ${stderr.trim().slice(0, 500)}`));
    });
    return { server, namespace: id };
  } finally {
    closeSync(fd);
  }
}
