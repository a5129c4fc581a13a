/**
 * The one error type of the agent layer, used on both sides of the channel. It is
 * shaped like the rest of pyro's errors (`code`, `message`, `hint`) but defined here
 * because the agent is the bottom layer and imports nothing from core.
 */

/** Codes an agent op may return in an error response. */
export const AGENT_OP_ERROR_CODES = [
  "path_outside_workspace",
  "not_found",
  "invalid_argument",
  "patch_rejected",
  "timeout",
  "conflict",
  "permission_denied",
  "cancelled",
  "unsupported",
  "internal",
] as const;

/** Codes the host-side client raises itself, about the channel rather than an op. */
export const AGENT_CHANNEL_ERROR_CODES = [
  "agent_disconnected",
  "protocol_violation",
  "version_mismatch",
  "timeout",
  "cancelled",
  "invalid_argument",
] as const;

/** Failure of an agent operation or of the channel to the agent. Branch on `code`. */
export class AgentError extends Error {
  readonly code: string;
  readonly hint?: string;

  constructor(code: string, message: string, hint?: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "AgentError";
    this.code = code;
    if (hint !== undefined) this.hint = hint;
  }

  /** The wire shape of an error response's `error` field. */
  toJSON(): { code: string; message: string; hint?: string } {
    return this.hint === undefined
      ? { code: this.code, message: this.message }
      : { code: this.code, message: this.message, hint: this.hint };
  }
}

// Node errno codes that have a meaning for the caller; anything else is `internal`.
const ERRNO_CODES: Record<string, { code: string; message: string }> = {
  ENOENT: { code: "not_found", message: "no such file or directory" },
  ENOTDIR: { code: "invalid_argument", message: "not a directory" },
  EISDIR: { code: "invalid_argument", message: "is a directory" },
  EEXIST: { code: "conflict", message: "already exists" },
  ENOTEMPTY: { code: "conflict", message: "directory not empty" },
  ELOOP: { code: "invalid_argument", message: "too many levels of symbolic links" },
  ENAMETOOLONG: { code: "invalid_argument", message: "name too long" },
  EACCES: { code: "permission_denied", message: "permission denied" },
  EPERM: { code: "permission_denied", message: "operation not permitted" },
  EROFS: { code: "permission_denied", message: "read-only file system" },
  ENOSPC: { code: "internal", message: "no space left on device" },
};

/**
 * Turns anything thrown inside an op into an AgentError. System errors map through one
 * table; `root` (when given) is stripped from paths so messages name workspace paths.
 */
export function toAgentError(err: unknown, root?: string): AgentError {
  if (err instanceof AgentError) return err;
  const errno = err as NodeJS.ErrnoException | undefined;
  if (errno && typeof errno === "object" && typeof errno.code === "string" && ERRNO_CODES[errno.code]) {
    const mapped = ERRNO_CODES[errno.code]!;
    let where = typeof errno.path === "string" ? errno.path : "";
    if (root && where.startsWith(root)) where = where.slice(root.length).replace(/^\/+/, "") || ".";
    return new AgentError(mapped.code, where ? `${mapped.message}: ${where}` : mapped.message, undefined, {
      cause: err,
    });
  }
  if (err instanceof Error && err.name === "AbortError") {
    return new AgentError("cancelled", "the operation was cancelled", undefined, { cause: err });
  }
  const message = err instanceof Error ? err.message : String(err);
  return new AgentError("internal", message || "internal error", undefined, { cause: err });
}
