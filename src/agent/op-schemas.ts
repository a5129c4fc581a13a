/**
 * Per-op argument and result schemas. Both sides validate against these: the agent
 * validates args before running an op, the client validates args before sending and
 * results before returning them. Result fields are snake_case, like every pyro surface.
 */
import * as z from "zod/mini";
import "./zod.js";
import { count, envName, envValue, pathArg } from "./schema-parts.js";
import {
  shellCloseArgs,
  shellCloseResult,
  shellListArgs,
  shellListResult,
  shellOpenArgs,
  shellOpenResult,
  shellReadArgs,
  shellReadResult,
  shellResizeArgs,
  shellResizeResult,
  shellSignalArgs,
  shellSignalResult,
  shellWriteArgs,
  shellWriteResult,
} from "./shell-schemas.js";

export * from "./shell-schemas.js";

import { MAX_EXEC_OUTPUT_BYTES } from "./capture.js";

export { MAX_EXEC_OUTPUT_BYTES } from "./capture.js";
/** Cap on `file_read.max_bytes` for inline (non-streamed) reads. */
export const MAX_INLINE_READ_BYTES = 16 * 1024 * 1024;
/** Default `file_read.max_bytes` for inline reads. */
export const DEFAULT_INLINE_READ_BYTES = 1024 * 1024;
/** Longest `exec.timeout_ms` accepted (24 h). */
export const MAX_EXEC_TIMEOUT_MS = 24 * 60 * 60 * 1000;

const artifactType = z.enum(["file", "directory", "symlink", "other"]);
const changeStatus = z.enum(["added", "modified", "deleted"]);

export const pingArgs = z.strictObject({});
export const pingResult = z.strictObject({ time_ms: z.number() });

export const infoArgs = z.strictObject({});
export const infoResult = z.strictObject({
  kernel: z.string(),
  hostname: z.string(),
  pid: z.int(),
  node: z.string(),
  root: z.string(),
});

/**
 * `reset`: the agent's part of an in-place reset (docs/protocol.md). `begin` refuses new
 * processes and leaves /workspace; `finish` forgets the ended services and shells and
 * enters the new /workspace.
 */
export const resetArgs = z.strictObject({ phase: z.enum(["begin", "finish"]) });
export const resetResult = z.strictObject({ phase: z.enum(["begin", "finish"]) });

export const execArgs = z
  .strictObject({
    command: z.string().check(z.minLength(1)),
    cwd: z.optional(pathArg),
    env: z.optional(z.record(envName, envValue)),
    timeout_ms: z.int().check(z.minimum(1), z.maximum(MAX_EXEC_TIMEOUT_MS)),
    /** Per stream: past it, `stdout`/`stderr` keep their head and tail around a marker line. */
    max_output_bytes: z.int().check(z.minimum(0), z.maximum(MAX_EXEC_OUTPUT_BYTES)),
    /**
     * A second, larger cut of the same streams for the command history (`stdout_log`,
     * `stderr_log`), sent only where it differs from the first.
     */
    log_output_bytes: z.optional(z.int().check(z.minimum(0), z.maximum(MAX_EXEC_OUTPUT_BYTES))),
    /**
     * Also send the output live, as data frames on the request's channel: each payload is
     * one tag byte (1 stdout, 2 stderr) and then the bytes.
     */
    stream: z._default(z.boolean(), false),
    /** The request's upload stream is the command's stdin (else stdin is /dev/null). */
    stdin: z._default(z.boolean(), false),
  })
  .check(
    z.refine(
      (a) => a.max_output_bytes + (a.log_output_bytes ?? 0) <= MAX_EXEC_OUTPUT_BYTES,
      `max_output_bytes + log_output_bytes must be at most ${MAX_EXEC_OUTPUT_BYTES}`,
    ),
  );
export const execResult = z.strictObject({
  exit_code: z.int(),
  /** Head, marker line and tail when the stream was over `max_output_bytes`. */
  stdout: z.string(),
  stderr: z.string(),
  /** Full sizes of the streams in bytes, whatever was kept. */
  stdout_bytes: count,
  stderr_bytes: count,
  /** The streams cut at `log_output_bytes`, when that cut differs from `stdout`/`stderr`. */
  stdout_log: z.optional(z.string()),
  stderr_log: z.optional(z.string()),
  duration_ms: z.number().check(z.minimum(0)),
  timed_out: z.boolean(),
  /** A stream was over `max_output_bytes`. */
  truncated: z.boolean(),
});

export const fileEntry = z.strictObject({
  path: z.string(),
  artifact_type: artifactType,
  size_bytes: count,
  link_target: z.nullable(z.string()),
});
export const fileListArgs = z.strictObject({ path: pathArg, recursive: z._default(z.boolean(), false) });
export const fileListResult = z.strictObject({
  path: z.string(),
  entries: z.array(fileEntry),
  /** True when the listing stopped at the entry cap. */
  truncated: z.boolean(),
});

export const fileReadArgs = z.strictObject({
  path: pathArg,
  max_bytes: z.optional(z.int().check(z.minimum(0))),
  /** Send the bytes as data frames on the request's channel instead of inline. */
  stream: z._default(z.boolean(), false),
});
export const fileReadResult = z.strictObject({
  path: z.string(),
  content: z.string(),
  /** "stream" when the bytes were sent as data frames and `content` is empty. */
  encoding: z.enum(["utf8", "base64", "stream"]),
  size_bytes: count,
  truncated: z.boolean(),
});

export const fileWriteArgs = z.strictObject({
  path: pathArg,
  content: z.string(),
  encoding: z.enum(["utf8", "base64"]),
});
export const fileWriteResult = z.strictObject({ path: z.string(), size_bytes: count, created: z.boolean() });

export const patchApplyArgs = z.strictObject({ patch: z.string() });
export const patchApplyResult = z.strictObject({
  changed: z.boolean(),
  files: z.array(z.strictObject({ path: z.string(), status: changeStatus })),
});

export const diffArgs = z.strictObject({
  base: pathArg,
  /** false: entries and summary only, no patch text (`workspace commit` needs no patch). */
  patch: z._default(z.boolean(), true),
});
export const diffResult = z.strictObject({
  changed: z.boolean(),
  patch: z.string(),
  summary: z.strictObject({ total: count, added: count, modified: count, deleted: count }),
  entries: z.array(z.strictObject({ path: z.string(), status: changeStatus })),
  /** True when `patch` was cut at the size cap (entries and summary stay complete). */
  truncated: z.boolean(),
});

export const tarOutArgs = z.strictObject({
  path: pathArg,
  /**
   * Only these files and symlinks under `path` (a directory), named relative to it, none
   * of them followed (`workspace commit` takes exactly the changed paths). A name that
   * is missing, or not a plain file or symlink under real directories, is left out.
   */
  paths: z.optional(z.array(pathArg).check(z.maxLength(1_000_000))),
});
export const tarOutResult = z.strictObject({
  artifact_type: z.enum(["file", "directory"]),
  bytes: count,
  entries: count,
});

export const tarInArgs = z.strictObject({ dest: pathArg });
export const tarInResult = z.strictObject({
  dest: z.string(),
  /** Regular files extracted. */
  files: count,
  /** Bytes of regular-file content extracted. */
  bytes: count,
});

/** VM guests only (agent started with --vm): the host's clock, entropy, and /workspace. */
export const vmSetupArgs = z.strictObject({
  /** Host wall clock (ms since the epoch), set as the guest's clock. */
  time_ms: z.number().check(z.minimum(0)),
  /** Fresh random bytes (base64) mixed into the guest kernel's entropy pool. */
  entropy: z.string().check(z.maxLength(4096)),
  hostname: z.string().check(z.regex(/^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$/)),
  /**
   * false: the clock, entropy and hostname only, /workspace left alone (the template VM,
   * whose seed disk is a blank placeholder: it runs the op once so its clones start with
   * the op's code loaded and compiled).
   */
  mount: z.optional(z.boolean()),
});
export const vmSetupResult = z.strictObject({
  /** True when this call mounted /workspace (false: it was already mounted). */
  mounted: z.boolean(),
  kernel: z.string(),
  /** Time spent in the guest: the whole op, and the one helper (or shell) that sets the clock and mounts. */
  duration_ms: z.number().check(z.minimum(0)),
  shell_ms: z.number().check(z.minimum(0)),
});

/** VM guests only: extracts an uploaded snapshot tree under the guest's snapshot directory. */
export const vmSnapshotInArgs = z.strictObject({
  name: z.string().check(z.regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/)),
});
export const vmSnapshotInResult = z.strictObject({ path: z.string(), files: count, bytes: count });

/** VM guests only: flushes every filesystem to its disk (before the host stops the VM). */
export const vmSyncArgs = z.strictObject({});
export const vmSyncResult = z.strictObject({ duration_ms: z.number().check(z.minimum(0)) });

// --- services (guest/services.ts) ----------------------------------------------------

/** A service name: letters, digits, '.', '_', '-', 1-63 characters. */
export const serviceName = z
  .string()
  .check(
    z.regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/, "service names are 1-63 letters, digits, '.', '_' or '-'"),
  );

/** How a service is known to be ready: a file exists, a TCP port accepts, an HTTP URL answers, a command succeeds. */
export const readyProbe = z.discriminatedUnion("kind", [
  z.strictObject({ kind: z.literal("file"), path: pathArg.check(z.minLength(1)) }),
  z.strictObject({ kind: z.literal("tcp"), port: z.int().check(z.minimum(1), z.maximum(65535)) }),
  z.strictObject({ kind: z.literal("http"), url: z.string().check(z.minLength(1), z.maxLength(2048)) }),
  z.strictObject({ kind: z.literal("command"), command: z.string().check(z.minLength(1)) }),
]);

export const serviceState = z.enum(["starting", "ready", "failed", "stopped"]);

export const serviceStatus = z.strictObject({
  name: z.string(),
  command: z.string(),
  state: serviceState,
  pid: z.nullable(z.int()),
  started_at: z.string(),
  ready_at: z.nullable(z.string()),
  exit_code: z.nullable(z.int()),
  ready: z.nullable(readyProbe),
});

export const serviceStartArgs = z.strictObject({
  name: serviceName,
  command: z.string().check(z.minLength(1)),
  cwd: z.optional(pathArg),
  env: z.optional(z.record(envName, envValue)),
  ready: z._default(z.nullable(readyProbe), null),
  ready_timeout_ms: z._default(z.int().check(z.minimum(1), z.maximum(MAX_EXEC_TIMEOUT_MS)), 30_000),
});
/** `state` is ready, failed (it exited first: `exit_code`) or starting (the probe timed out); `log_tail` then. */
export const serviceStartResult = z.strictObject({
  service: serviceStatus,
  timed_out: z.boolean(),
  log_tail: z.array(z.string()),
});
export const serviceListArgs = z.strictObject({});
export const serviceListResult = z.strictObject({ services: z.array(serviceStatus) });
export const serviceStatusArgs = z.strictObject({ name: serviceName });
export const serviceStatusResult = z.strictObject({ service: serviceStatus });
export const serviceLogsArgs = z.strictObject({
  name: serviceName,
  tail_lines: z._default(z.int().check(z.minimum(1), z.maximum(10_000)), 100),
});
export const serviceLogsResult = z.strictObject({
  name: z.string(),
  lines: z.array(z.strictObject({ stream: z.enum(["stdout", "stderr"]), text: z.string() })),
  truncated: z.boolean(),
});
export const serviceStopArgs = z.strictObject({
  name: serviceName,
  grace_ms: z._default(z.int().check(z.minimum(0), z.maximum(60_000)), 5000),
});
export const serviceStopResult = z.strictObject({ service: serviceStatus, killed: z.boolean() });

/**
 * Every op, with its schemas and how it uses the request's channel:
 * `upload` ops read a data stream from the host, `download` ops may send one.
 */
export const OPS = {
  ping: { args: pingArgs, result: pingResult, upload: false, download: false },
  info: { args: infoArgs, result: infoResult, upload: false, download: false },
  reset: { args: resetArgs, result: resetResult, upload: false, download: false },
  exec: { args: execArgs, result: execResult, upload: false, download: false },
  file_list: { args: fileListArgs, result: fileListResult, upload: false, download: false },
  file_read: { args: fileReadArgs, result: fileReadResult, upload: false, download: true },
  file_write: { args: fileWriteArgs, result: fileWriteResult, upload: false, download: false },
  patch_apply: { args: patchApplyArgs, result: patchApplyResult, upload: false, download: false },
  diff: { args: diffArgs, result: diffResult, upload: false, download: false },
  tar_out: { args: tarOutArgs, result: tarOutResult, upload: false, download: true },
  tar_in: { args: tarInArgs, result: tarInResult, upload: true, download: false },
  vm_setup: { args: vmSetupArgs, result: vmSetupResult, upload: false, download: false },
  vm_snapshot_in: { args: vmSnapshotInArgs, result: vmSnapshotInResult, upload: true, download: false },
  vm_sync: { args: vmSyncArgs, result: vmSyncResult, upload: false, download: false },
  service_start: { args: serviceStartArgs, result: serviceStartResult, upload: false, download: false },
  service_list: { args: serviceListArgs, result: serviceListResult, upload: false, download: false },
  service_status: { args: serviceStatusArgs, result: serviceStatusResult, upload: false, download: false },
  service_logs: { args: serviceLogsArgs, result: serviceLogsResult, upload: false, download: false },
  service_stop: { args: serviceStopArgs, result: serviceStopResult, upload: false, download: false },
  shell_open: { args: shellOpenArgs, result: shellOpenResult, upload: false, download: false },
  shell_write: { args: shellWriteArgs, result: shellWriteResult, upload: false, download: false },
  shell_read: { args: shellReadArgs, result: shellReadResult, upload: false, download: false },
  shell_signal: { args: shellSignalArgs, result: shellSignalResult, upload: false, download: false },
  shell_resize: { args: shellResizeArgs, result: shellResizeResult, upload: false, download: false },
  shell_close: { args: shellCloseArgs, result: shellCloseResult, upload: false, download: false },
  shell_list: { args: shellListArgs, result: shellListResult, upload: false, download: false },
} as const;

/** Tag bytes of exec's live output frames. */
export const EXEC_STREAM_TAG = { stdout: 1, stderr: 2 } as const;

/** True when a request of `op` with these (parsed) args reads an upload stream. */
export function takesUpload(op: OpName, args: unknown): boolean {
  return OPS[op].upload || (op === "exec" && (args as { stdin?: boolean }).stdin === true);
}

/** True when a request of `op` with these (parsed) args sends data frames before its response. */
export function sendsData(op: OpName, args: unknown): boolean {
  const a = args as { stream?: boolean };
  return op === "tar_out" || ((op === "file_read" || op === "exec") && a.stream === true);
}

export type OpName = keyof typeof OPS;
/** What a caller passes (defaults may be omitted). */
export type OpArgs<O extends OpName> = z.input<(typeof OPS)[O]["args"]>;
/** What an op receives after validation (defaults filled in). */
export type OpParsedArgs<O extends OpName> = z.output<(typeof OPS)[O]["args"]>;
export type OpResult<O extends OpName> = z.output<(typeof OPS)[O]["result"]>;

/** Every op name, in a stable order (the agent advertises these in its hello). */
export const OP_NAMES = Object.keys(OPS) as OpName[];

export function isOpName(name: string): name is OpName {
  return Object.hasOwn(OPS, name);
}
