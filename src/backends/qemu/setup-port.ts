/**
 * A VM's setup after its start (clock, entropy, hostname, /workspace: vm/setup-helper.ts),
 * through the setup helper's own virtio-serial port when the VM was restored from the
 * template. The agent's vm_setup does the same work through the same helper, but under
 * TCG every code path a restored clone runs costs its first translation, and the agent's
 * request path (framing, dispatch, argument checks, a unix socket to the helper: Node
 * code) cost a reset 0.25-0.45 s beyond the helper's own work. Over the port the host
 * talks to the static helper directly, and at once: the helper works while the agent
 * answers its handshake.
 *
 * A cold boot keeps the agent's vm_setup after the handshake: the port could take the
 * request while the guest is still booting, and the clock it carries would be stale by
 * the boot's length.
 */
import { randomBytes } from "node:crypto";
import type { Duplex } from "node:stream";
import { AgentClient } from "../../agent/client.js";
import { PyroError } from "../../errors.js";
import { connectUnix } from "../common.js";
import { setupGuest } from "../vm/setup.js";
import { setupSocket } from "./machine.js";
import { describeSetupHelper } from "./setup-diagnosis.js";

/** The longest reply line read from the guest (it answers "ok mounted=N" or "error ..."). */
const REPLY_MAX = 2048;

/** The helper's request line: `HOSTNAME UNIX_MS ENTROPY_HEX [nomount]`. */
export function setupRequest(o: {
  hostname: string;
  timeMs: number;
  entropy: Buffer;
  mount: boolean;
}): string {
  if (!/^[A-Za-z0-9-]{1,63}$/.test(o.hostname))
    throw new PyroError("invalid_argument", `not a guest hostname: ${JSON.stringify(o.hostname)}`);
  if (o.entropy.length < 32 || o.entropy.length > 512)
    throw new PyroError("invalid_argument", "the guest takes 32-512 bytes of entropy");
  return `${o.hostname} ${Math.floor(o.timeMs)} ${o.entropy.toString("hex")}${o.mount ? "" : " nomount"}\n`;
}

/**
 * Sends `request` to the setup helper's port of the VM whose sockets are in `sockets` and
 * resolves with `mounted` from its reply; its error reply, no reply within `timeoutMs`, or
 * a hang-up reject (the start then fails: nothing is retried on a VM in an unknown state).
 * Without a reply in time, `describe` (setup-diagnosis.ts) says what the guest shows of
 * its helper, for the error; a reply that comes meanwhile still counts.
 */
export async function askSetupPort(
  sockets: string,
  request: string,
  options: { timeoutMs: number; signal?: AbortSignal; describe?: () => Promise<string> },
): Promise<boolean> {
  const sock = await connectUnix(setupSocket(sockets), options.timeoutMs);
  return new Promise<boolean>((resolve, reject) => {
    let reply = "";
    let settled = false;
    const done = (err: Error | null, mounted = false) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      options.signal?.removeEventListener("abort", onAbort);
      sock.destroy();
      if (err) reject(err);
      else resolve(mounted);
    };
    const timer = setTimeout(async () => {
      const message = `the VM's setup helper did not answer within ${options.timeoutMs} ms`;
      const guest = options.describe ? ` (guest: ${await options.describe()})` : "";
      done(new PyroError("timeout", `${message}${guest}`));
    }, options.timeoutMs);
    const onAbort = () => done(new PyroError("cancelled", "the start was cancelled"));
    if (options.signal?.aborted) return onAbort();
    options.signal?.addEventListener("abort", onAbort, { once: true });
    sock.setEncoding("utf8");
    sock.on("data", (d: string) => {
      reply += d;
      const nl = reply.indexOf("\n");
      if (nl < 0 && reply.length <= REPLY_MAX) return;
      const line = reply.slice(0, nl < 0 ? REPLY_MAX : nl);
      const m = /^ok mounted=([01])$/.exec(line);
      if (m) return done(null, m[1] === "1");
      // What the guest says is shown, not trusted: printable, bounded.
      const why = line
        .replace(/^error /, "")
        .replace(/[^\x20-\x7e]/g, "?")
        .slice(0, 300);
      done(new PyroError("backend_unavailable", `the VM's setup failed: ${why || "no reply"}`));
    });
    sock.on("error", (err) =>
      done(new PyroError("backend_unavailable", `the VM's setup port: ${err.message}`)),
    );
    sock.on("close", () =>
      done(new PyroError("backend_unavailable", "the VM's setup port closed without a reply")),
    );
    sock.write(request);
  });
}

/** How a start's guest became ready, for StartTiming. */
export interface GuestReady {
  /** The agent finished its handshake (from the call). */
  answered_ms: number;
  /** The setup's own time: the port's round trip, or vm_setup inside the guest. */
  setup_ms: number;
  via: "port" | "agent";
}

/**
 * The guest ready to work: the agent answering and the setup done. A restored VM whose
 * agent disk has the helper: the port's request and the agent's handshake at once; else
 * the agent's vm_setup after its handshake (setupGuest).
 */
export async function guestReady(
  connect: () => Promise<Duplex>,
  o: {
    sockets: string;
    viaPort: boolean;
    /** The port's request only once the agent answered (benchmarks: the restore alone). */
    sequential?: boolean;
    timeoutMs: number;
    hostname: string;
    signal?: AbortSignal;
  },
): Promise<GuestReady> {
  const sig = o.signal ? { signal: o.signal } : {};
  if (!o.viaPort) {
    const r = await setupGuest(connect, { timeoutMs: o.timeoutMs, hostname: o.hostname, ...sig });
    return { answered_ms: r.answered_ms, setup_ms: r.guest_ms, via: "agent" };
  }
  const started = performance.now();
  const since = () => Math.round(performance.now() - started);
  const handshake = (async () => {
    const client = await AgentClient.connect(await connect(), { timeoutMs: o.timeoutMs, ...sig });
    const ms = since();
    await client.close();
    return ms;
  })();
  if (o.sequential) await handshake;
  const setupStarted = performance.now();
  const request = setupRequest({
    hostname: o.hostname,
    timeMs: Date.now(),
    entropy: randomBytes(64),
    mount: true,
  });
  const port = askSetupPort(o.sockets, request, {
    timeoutMs: 60_000,
    describe: () => describeSetupHelper(connect),
    ...sig,
  }).then(() => Math.round(performance.now() - setupStarted));
  const [answered_ms, setup_ms] = await Promise.all([handshake, port]);
  return { answered_ms, setup_ms, via: "port" };
}
