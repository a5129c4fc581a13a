import type { BuildProgress } from "../core/vocabulary.js";

/** What a tool handler may report while it works. */
export interface Progress {
  /** Reports one step; `message` is shown by clients that display progress. */
  report(message: string, total?: number): void;
  /** An environment build step (`pyro env pull` phases), rendered as a progress message. */
  build(p: BuildProgress): void;
}

export interface ProgressSink {
  progressToken: string | number | undefined;
  send(params: {
    progressToken: string | number;
    progress: number;
    total?: number;
    message?: string;
  }): Promise<void>;
}

/** Heartbeat period for long tools: a client that resets its timeout on progress keeps waiting. */
export const HEARTBEAT_MS = 1000;

/**
 * MCP progress for one request. Nothing is sent unless the client asked for progress
 * (a `progressToken` in the request's `_meta`). `progress` increases by one per
 * notification, as the spec requires it to grow; `total` is only set when known.
 * Sending is fire-and-forget: a failed notification never fails the tool call.
 */
export class RequestProgress implements Progress {
  private step = 0;
  private timer: NodeJS.Timeout | undefined;
  private readonly started = Date.now();

  constructor(private readonly sink: ProgressSink) {}

  get enabled(): boolean {
    return this.sink.progressToken !== undefined;
  }

  report(message: string, total?: number): void {
    const token = this.sink.progressToken;
    if (token === undefined) return;
    this.step += 1;
    this.sink
      .send({ progressToken: token, progress: this.step, ...(total !== undefined ? { total } : {}), message })
      .catch(() => {});
  }

  build(p: BuildProgress): void {
    const parts = [`environment ${p.phase}`];
    if (p.message) parts.push(p.message);
    if (p.count) parts.push(`${p.count} packages`);
    this.report(parts.join(": "));
  }

  /** Sends a heartbeat every HEARTBEAT_MS until `stop()`: what is running and for how long. */
  startHeartbeat(what: string): void {
    if (!this.enabled || this.timer) return;
    this.timer = setInterval(() => {
      this.report(`${what}: ${Math.round((Date.now() - this.started) / 1000)}s`);
    }, HEARTBEAT_MS);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }
}
