import type { Socket } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { PyroError } from "../../errors.js";
import { connectUnix } from "../common.js";

/**
 * A minimal client for the QEMU Machine Protocol (JSON lines over the `-qmp` unix socket):
 * greeting, `qmp_capabilities`, then one command at a time. Asynchronous events are
 * skipped. Only what pyro needs: stop, cont, migrate (save a VM's state), status, quit.
 */
export class QmpClient {
  private buffer = "";
  private waiters: ((msg: Record<string, unknown> | null) => void)[] = [];
  private queue: Record<string, unknown>[] = [];
  private closed = false;

  private constructor(private readonly sock: Socket) {
    sock.setEncoding("utf8");
    sock.on("data", (chunk: string) => {
      this.buffer += chunk;
      for (let nl = this.buffer.indexOf("\n"); nl >= 0; nl = this.buffer.indexOf("\n")) {
        const line = this.buffer.slice(0, nl).trim();
        this.buffer = this.buffer.slice(nl + 1);
        if (!line) continue;
        let msg: Record<string, unknown>;
        try {
          msg = JSON.parse(line) as Record<string, unknown>;
        } catch {
          continue;
        }
        if ("event" in msg) continue;
        const w = this.waiters.shift();
        if (w) w(msg);
        else this.queue.push(msg);
      }
    });
    const end = () => {
      this.closed = true;
      for (const w of this.waiters.splice(0)) w(null);
    };
    sock.on("close", end);
    sock.on("error", end);
  }

  /** Connects (retrying until the socket exists, up to `timeoutMs`) and negotiates capabilities. */
  static async connect(path: string, timeoutMs: number): Promise<QmpClient> {
    const deadline = Date.now() + timeoutMs;
    let lastErr: unknown;
    while (Date.now() < deadline) {
      try {
        const sock = await connectUnix(path, Math.max(1000, deadline - Date.now()));
        const c = new QmpClient(sock);
        try {
          await c.next(Math.max(1000, deadline - Date.now())); // greeting
          await c.execute("qmp_capabilities", undefined, Math.max(1000, deadline - Date.now()));
        } catch (err) {
          c.close();
          throw err;
        }
        return c;
      } catch (err) {
        lastErr = err;
        await sleep(10);
      }
    }
    throw new PyroError(
      "backend_unavailable",
      `QEMU's control socket did not answer: ${(lastErr as Error)?.message}`,
    );
  }

  private next(timeoutMs: number): Promise<Record<string, unknown>> {
    const queued = this.queue.shift();
    if (queued) return Promise.resolve(queued);
    if (this.closed)
      return Promise.reject(new PyroError("backend_unavailable", "QEMU closed its control socket"));
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== waiter);
        // A late reply would be taken for the next command's: this client is done.
        this.close();
        reject(new PyroError("timeout", `QEMU did not answer within ${timeoutMs} ms`));
      }, timeoutMs);
      const waiter = (msg: Record<string, unknown> | null) => {
        clearTimeout(timer);
        if (msg) resolve(msg);
        else reject(new PyroError("backend_unavailable", "QEMU closed its control socket"));
      };
      this.waiters.push(waiter);
    });
  }

  /** Runs one command; resolves with its `return`, rejects with QEMU's error description. */
  async execute(command: string, args?: Record<string, unknown>, timeoutMs = 30_000): Promise<unknown> {
    this.sock.write(
      `${JSON.stringify(args ? { execute: command, arguments: args } : { execute: command })}\n`,
    );
    const msg = await this.next(timeoutMs);
    if ("error" in msg) {
      const e = msg.error as { class?: string; desc?: string };
      throw new PyroError("backend_unavailable", `QEMU ${command}: ${e.desc ?? e.class ?? "failed"}`);
    }
    return msg.return;
  }

  /** The VM's run state ("running", "paused", "inmigrate", "postmigrate", ...). */
  async status(): Promise<string> {
    const r = (await this.execute("query-status")) as { status?: string };
    return r.status ?? "unknown";
  }

  /** Polls `query-migrate` until the outgoing migration completes; throws if it fails. */
  async waitMigration(timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const r = (await this.execute("query-migrate")) as { status?: string; "error-desc"?: string };
      if (r.status === "completed") return;
      if (r.status === "failed" || r.status === "cancelled")
        throw new PyroError(
          "backend_unavailable",
          `saving the VM state failed: ${r["error-desc"] ?? r.status}`,
        );
      await sleep(20);
    }
    throw new PyroError("timeout", `saving the VM state took longer than ${timeoutMs} ms`);
  }

  /**
   * The last lines of the guest's console, kept in the `console` ring-buffer chardev (see
   * machine.ts), joined on one line for error messages.
   */
  async consoleTail(lines = 5): Promise<string> {
    return tailLines(await this.consoleRead(), lines);
  }

  /** What the console printed since the last read (reading consumes the ring). */
  consoleRead(): Promise<string> {
    return this.execute("ringbuf-read", { device: "console", size: 65536, format: "utf8" }, 2000).then(
      String,
      () => "",
    );
  }

  close(): void {
    this.sock.destroy();
  }
}

/** The last `lines` lines of console text, joined on one line for error messages. */
export function tailLines(text: string, lines = 5): string {
  return text.trim().split("\n").slice(-lines).join(" | ") || "(empty)";
}
