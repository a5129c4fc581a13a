import { AgentError } from "./agent/errors.js";

/**
 * The one error type of pyro. Callers branch on `code`, never on message text.
 * Every surface renders it the same way: `{error: {code, message, hint?}}`.
 */
export const ERROR_CODES = [
  "workspace_not_found",
  "environment_not_found",
  "backend_unavailable",
  "path_outside_workspace",
  "not_found",
  "patch_rejected",
  "invalid_argument",
  "timeout",
  "conflict",
  "workspace_stopped",
  "build_failed",
  "permission_denied",
  "cancelled",
  /** The backend or guest cannot do this at all (not a passing condition). */
  "unsupported",
  "internal",
] as const;

export type ErrorCode = (typeof ERROR_CODES)[number];

export interface ErrorObject {
  code: ErrorCode;
  message: string;
  hint?: string;
}

/**
 * A step a hint points to, named the way each surface names it: the CLI command or flag
 * (the SDK shows it too), and the MCP tool or argument where one exists. A hint refers
 * to it as `{action}`; without that, the action is appended.
 */
export interface HintAction {
  cli: string;
  tool?: string;
}

export type Surface = "cli" | "tool";

/** The actions core hints name most. */
export const ACTIONS = {
  listWorkspaces: { cli: "pyro workspace list", tool: "workspace_list" },
  workspaceStatus: { cli: "pyro workspace status", tool: "workspace_status" },
  listSnapshots: { cli: "pyro workspace snapshot list", tool: "snapshot_list" },
  startWorkspace: (id: string): HintAction => ({
    cli: `pyro workspace start ${id}`,
    tool: "workspace_start",
  }),
  networkOff: { cli: "--network off", tool: 'network_policy "off"' },
} satisfies Record<string, HintAction | ((...a: string[]) => HintAction)>;

export class PyroError extends Error {
  readonly code: ErrorCode;
  /** The hint as the CLI and the SDK show it; MCP uses `hintFor("tool")`. */
  readonly hint?: string;
  readonly action?: HintAction;
  private readonly template?: string;

  constructor(
    code: ErrorCode,
    message: string,
    hint?: string,
    options?: { cause?: unknown; action?: HintAction },
  ) {
    super(bounded(message), options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = "PyroError";
    this.code = code;
    if (options?.action) this.action = options.action;
    if (hint !== undefined) {
      this.template = bounded(hint);
      this.hint = renderHint(this.template, this.action, "cli");
    }
  }

  /** The hint for a surface: the CLI names a command (`pyro workspace list`), MCP a tool (workspace_list). */
  hintFor(surface: Surface): string | undefined {
    return this.template === undefined ? undefined : renderHint(this.template, this.action, surface);
  }

  /** The same error with its texts rewritten (redaction), its action and cause kept. */
  withTexts(rewrite: (text: string) => string): PyroError {
    return new PyroError(
      this.code,
      rewrite(this.message),
      this.template === undefined ? undefined : rewrite(this.template),
      { cause: this.cause, ...(this.action ? { action: this.action } : {}) },
    );
  }

  toJSON(surface: Surface = "cli"): ErrorObject {
    const hint = this.hintFor(surface);
    return hint === undefined
      ? { code: this.code, message: this.message }
      : { code: this.code, message: this.message, hint };
  }
}

function renderHint(template: string, action: HintAction | undefined, surface: Surface): string {
  if (!action) return template;
  const named = surface === "tool" && action.tool ? action.tool : `\`${action.cli}\``;
  return template.includes("{action}") ? template.replaceAll("{action}", named) : `${template}: ${named}`;
}

/** Longest quoted value kept whole in a message; longer ones keep a prefix and their length. */
const QUOTE_MAX = 80;
/** Longest message or hint: an error is read by a person or a model, never a data channel. */
const MESSAGE_MAX = 2000;
const LONG_QUOTE = new RegExp(`'([^'\\n]{${QUOTE_MAX + 1},})'`, "g");

/**
 * Errors quote what they were given (`no workspace 'x'`), and what they were given can be
 * megabytes (a fuzzed id, a pasted file): a quoted value over QUOTE_MAX characters keeps
 * a prefix and says how long it was, and the whole text is cut at MESSAGE_MAX.
 */
export function bounded(text: string): string {
  const quoted = text.replace(LONG_QUOTE, (_, v: string) => quote(v));
  return quoted.length > MESSAGE_MAX
    ? `${quoted.slice(0, MESSAGE_MAX)}… (${quoted.length - MESSAGE_MAX} more characters)`
    : quoted;
}

/** A value for a message: `'value'`, or its prefix and length when long. */
export function quote(value: string): string {
  return value.length > QUOTE_MAX
    ? `'${value.slice(0, QUOTE_MAX - 20)}…' (${value.length} characters)`
    : `'${value}'`;
}

/**
 * Maps anything thrown to a PyroError. Unknown errors become `internal`, keeping the
 * original as `cause` so PYRO_DEBUG can show it; Node system errors map through one table.
 */
export function toPyroError(err: unknown): PyroError {
  if (err instanceof PyroError) return err;
  const coded = codedError(err);
  if (coded) return coded;
  if (isErrnoException(err)) {
    const mapped = ERRNO_TABLE[err.code ?? ""];
    if (mapped)
      return new PyroError(mapped.code, `${mapped.message}: ${err.path ?? err.message}`, mapped.hint, {
        cause: err,
      });
  }
  if (err instanceof Error && err.name === "AbortError") {
    return new PyroError("cancelled", "the operation was cancelled", undefined, { cause: err });
  }
  const message = err instanceof Error ? err.message : String(err);
  return new PyroError("internal", message, "rerun with PYRO_DEBUG=1 for details", { cause: err });
}

const ERRNO_TABLE: Record<string, { code: ErrorCode; message: string; hint?: string }> = {
  ENOENT: { code: "not_found", message: "no such file or directory" },
  EACCES: { code: "permission_denied", message: "permission denied", hint: "some operations need root" },
  EPERM: { code: "permission_denied", message: "operation not permitted", hint: "some operations need root" },
  EEXIST: { code: "conflict", message: "already exists" },
  ENOTDIR: { code: "invalid_argument", message: "not a directory" },
  EISDIR: { code: "invalid_argument", message: "is a directory" },
  ENOSPC: {
    code: "internal",
    message: "no space left on device",
    hint: "free disk space, or run `pyro env prune`",
  },
};

/**
 * Errors from lower layers (the agent channel) carry a string `code` of their own. Codes
 * pyro shares pass through; channel failures map through one table.
 */
const CHANNEL_TABLE: Record<string, { code: ErrorCode; hint: string; action?: HintAction }> = {
  agent_disconnected: {
    code: "backend_unavailable",
    hint: "the workspace's sandbox went away; check {action}",
    action: ACTIONS.workspaceStatus,
  },
  protocol_violation: {
    code: "internal",
    hint: "the guest agent sent something invalid; the channel was closed",
  },
  version_mismatch: { code: "backend_unavailable", hint: "the guest agent speaks another protocol version" },
};

function codedError(err: unknown): PyroError | null {
  if (!(err instanceof AgentError)) return null;
  const { code, hint: h } = err;
  if ((ERROR_CODES as readonly string[]).includes(code))
    return new PyroError(code as ErrorCode, err.message, h, { cause: err });
  const mapped = CHANNEL_TABLE[code];
  if (mapped)
    return new PyroError(mapped.code, err.message, h ?? mapped.hint, {
      cause: err,
      ...(h === undefined && mapped.action ? { action: mapped.action } : {}),
    });
  return null;
}

function isErrnoException(err: unknown): err is NodeJS.ErrnoException {
  return err instanceof Error && typeof (err as NodeJS.ErrnoException).code === "string";
}

/** Exit codes are fixed: 0 success, 1 operation failed, 2 usage error. */
export const EXIT_OK = 0;
export const EXIT_FAILURE = 1;
export const EXIT_USAGE = 2;
