/**
 * What the engine tells whoever watches it: environment builds, sandbox starts, stops and
 * restarts, workspaces coming and going (created, deleted, reaped), refused network
 * connections. A surface subscribes (the MCP server turns events into
 * `notifications/message` and `notifications/resources/list_changed`); nothing in the
 * engine depends on anyone listening. Messages are redacted with the workspace's secret
 * values before any listener sees them, and a listener that throws never fails the
 * operation that emitted.
 */
import type { BuildProgress } from "../env/builder.js";
import { EnvironmentCache, type PullResult } from "../env/cache.js";

/** Syslog severities, as MCP logging names them (RFC 5424), least severe first. */
export const EVENT_LEVELS = [
  "debug",
  "info",
  "notice",
  "warning",
  "error",
  "critical",
  "alert",
  "emergency",
] as const;
export type EventLevel = (typeof EVENT_LEVELS)[number];

export type EventKind = "environment" | "sandbox" | "workspace" | "network";

export interface EngineEvent {
  level: EventLevel;
  kind: EventKind;
  /** One line for a person watching: what happened, to what. */
  message: string;
  /** The workspace concerned, if any (its secrets are redacted from `message`). */
  workspace_id?: string;
  /** The workspace list changed (a workspace was created or removed). */
  workspaces_changed?: boolean;
  /** Machine-readable details (ids, names, counts); never secret values. */
  data?: Record<string, unknown>;
}

export type EventListener = (event: EngineEvent) => void;

/** The engine's event fan-out. */
export class EngineEvents {
  private readonly listeners = new Set<EventListener>();

  /**
   * @param redact the redactor of a workspace's secret values (the engine's
   *   `secretRedactorById`), applied to every message about that workspace.
   */
  constructor(private readonly redact: (workspaceId: string) => (text: string) => string = () => (t) => t) {}

  /** Subscribes; returns the unsubscribe function. */
  on(listener: EventListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  get listening(): boolean {
    return this.listeners.size > 0;
  }

  emit(event: EngineEvent): void {
    if (this.listeners.size === 0) return;
    let e = event;
    if (e.workspace_id !== undefined) {
      let redact: (t: string) => string;
      try {
        redact = this.redact(e.workspace_id);
      } catch {
        // A redactor that cannot be built (the workspace's key unreadable): say nothing specific.
        redact = () => `${e.kind} event for workspace ${e.workspace_id}`;
      }
      e = { ...e, message: redact(e.message) };
    }
    for (const l of this.listeners) {
      try {
        l(e);
      } catch {
        // a watcher never fails the operation
      }
    }
  }
}

/**
 * The environment cache with its builds reported as events: one event when a build (or
 * a wait for another process's build) starts, one per new build phase, one when it is
 * done. A cached pull says nothing. Every caller of `engine.environments.pull` (create,
 * run, the CLI's `env pull`, MCP tools) goes through it.
 */
export class ObservedEnvironmentCache extends EnvironmentCache {
  events: EngineEvents | undefined;

  override async pull(
    name: string,
    options: Parameters<EnvironmentCache["pull"]>[1] = {},
  ): Promise<PullResult> {
    const events = this.events;
    if (!events?.listening) return super.pull(name, options);
    let phase: string | undefined;
    const started = performance.now();
    const onProgress = (p: BuildProgress) => {
      if (p.phase !== phase) {
        if (phase === undefined && p.phase !== "done")
          events.emit({
            level: "notice",
            kind: "environment",
            message: `environment ${name}: building (this can take a minute)`,
            data: { environment: name, phase: p.phase },
          });
        phase = p.phase;
        if (p.phase !== "done")
          events.emit({
            level: "info",
            kind: "environment",
            message: `environment ${name}: ${p.phase}${p.message ? `: ${p.message}` : ""}`,
            data: { environment: name, phase: p.phase },
          });
      }
      options.onProgress?.(p);
    };
    try {
      const r = await super.pull(name, { ...options, onProgress });
      if (r.built)
        events.emit({
          level: "notice",
          kind: "environment",
          message: `environment ${name}: built in ${((performance.now() - started) / 1000).toFixed(1)} s`,
          data: { environment: name, built: true },
        });
      return r;
    } catch (err) {
      events.emit({
        level: "error",
        kind: "environment",
        message: `environment ${name}: build failed: ${(err as Error).message}`,
        data: { environment: name },
      });
      throw err;
    }
  }
}
