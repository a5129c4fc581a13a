/**
 * MCP logging: `logging/setLevel` and `notifications/message`, and the one path every
 * host notification takes (nothing before the client is initialized; during a call, on
 * that call's stream).
 */
import type { Server } from "@modelcontextprotocol/sdk/server/index.js";
import type { RequestHandlerExtra } from "@modelcontextprotocol/sdk/shared/protocol.js";
import {
  ErrorCode,
  type LoggingLevel,
  LoggingLevelSchema,
  McpError,
  type ServerNotification,
  type ServerRequest,
} from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";
import { EVENT_LEVELS } from "../../core/events.js";

export type Extra = RequestHandlerExtra<ServerRequest, ServerNotification>;

/** The default logging level before a client sets one. */
export const DEFAULT_LOG_LEVEL: LoggingLevel = "info";

/** Sends host notifications and log messages to the client. */
export interface Notifier {
  /** Sends a notification once the client is initialized (dropped before). */
  notify(n: ServerNotification): void;
  /** A `notifications/message` at `level`, unless the client asked for less. */
  log(level: LoggingLevel, data: Record<string, unknown>): void;
  /** A call starts: notifications go on its stream until the returned function is called. */
  begin(extra: Extra): () => void;
}

const LENIENT_SET_LEVEL = z.object({ method: z.literal("logging/setLevel"), params: z.unknown() });

/** Answers `logging/setLevel` and returns the notifier the other host features use. */
export function registerLogging(low: Server): Notifier {
  let level: LoggingLevel = DEFAULT_LOG_LEVEL;
  let initialized = false;
  const inflight: Extra[] = [];
  const prevInit = low.oninitialized;
  low.oninitialized = () => {
    initialized = true;
    prevInit?.();
  };
  // Lenient on purpose: an unknown level is answered -32602 (invalid params) with the
  // levels, where the SDK's own schema check would answer -32603 (internal error).
  low.setRequestHandler(LENIENT_SET_LEVEL, (req) => {
    const raw = (req.params as { level?: unknown } | undefined)?.level;
    const parsed = LoggingLevelSchema.safeParse(raw);
    if (!parsed.success)
      throw new McpError(
        ErrorCode.InvalidParams,
        `unknown logging level '${String(raw).slice(0, 64)}'; levels: ${EVENT_LEVELS.join(", ")}`,
      );
    level = parsed.data;
    return {};
  });
  const notify = (n: ServerNotification): void => {
    if (!initialized) return;
    // During a call, on that call's stream (Streamable HTTP answers it there); else standalone.
    const current = inflight[inflight.length - 1];
    const sent = current ? current.sendNotification(n) : low.notification(n);
    sent.catch(() => {});
  };
  return {
    notify,
    log(lvl, data) {
      if (EVENT_LEVELS.indexOf(lvl) < EVENT_LEVELS.indexOf(level)) return;
      notify({ method: "notifications/message", params: { level: lvl, logger: "pyro", data } });
    },
    begin(extra) {
      inflight.push(extra);
      return () => {
        const i = inflight.lastIndexOf(extra);
        if (i >= 0) inflight.splice(i, 1);
      };
    },
  };
}
