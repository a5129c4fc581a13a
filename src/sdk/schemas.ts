/**
 * The SDK's argument contract: a zod schema for every argument of every public `Pyro`
 * method, with the ranges the MCP tools accept for the same operations. `Pyro` checks its
 * arguments against this table before it does anything (validate.ts), so a wrong type is
 * an `invalid_argument` PyroError naming the method and the argument, never a TypeError
 * from deep inside the core.
 *
 * Option keys are camelCase, one spelling each (results stay snake_case, as on every
 * surface). Option objects are strict: an unknown key is refused, not ignored, because a
 * misspelt option (`timeout` for `timeoutSeconds`, or the core's `timeout_seconds`) would
 * otherwise silently do nothing. Each option schema is checked against the method's option
 * type at compile time (`Keys<T>`), and those types are derived from the core's
 * (`CamelCased`), so an option added to a core type cannot be forgotten here.
 *
 * These schemas live in the SDK rather than reusing src/mcp/schemas.ts: the MCP tools call
 * the core beside the SDK (not through it), and their descriptions are written for a
 * model, not a programmer.
 */
import { z } from "zod";
import type { demo, prepare } from "../core/demo.js";
import type { doctor } from "../core/doctor.js";
import type { ExecOptions as CoreExecOptions, LogsOptions as CoreLogsOptions } from "../core/exec.js";
import { LIMITS } from "../core/limits.js";
import type { RunOptions as CoreRunOptions } from "../core/oneshot.js";
import { MAX_OUTPUT_BYTES, MIN_OUTPUT_BYTES } from "../core/output.js";
import type { StartServiceOptions as CoreStartServiceOptions } from "../core/services.js";
import { BACKEND_NAMES } from "../core/vocabulary.js";
import type { CreateOptions as CoreCreateOptions } from "../core/workspace-spec.js";

// ---------------------------------------------------------------- option types

/** `max_output_bytes` → `maxOutputBytes`, as a type. */
type Camel<S extends string> = S extends `${infer H}_${infer T}` ? `${H}${Capitalize<Camel<T>>}` : S;

/**
 * The SDK's spelling of a core option type: the same options with camelCase keys. Deriving
 * the SDK's option types from the core's keeps them from drifting apart; `Pyro` turns the
 * keys back with `coreOptions` (case.ts), the one place the SDK renames anything.
 */
export type CamelCased<T> = { [K in keyof T as K extends string ? Camel<K> : never]: T[K] };

/** Options of `run`: `maxOutputBytes` is per stream; past it a stream keeps its head and tail. */
export type RunOptions = CamelCased<Omit<CoreRunOptions, "environment">>;
/** Options of `execWorkspace`: `maxOutputBytes` is per stream; past it a stream keeps its head and tail. */
export type ExecOptions = CamelCased<CoreExecOptions>;
/** Options of `createWorkspace`. `seedPath` or `repoUrl` (with `repoRef`) seed /workspace. */
export type CreateWorkspaceOptions = CamelCased<CoreCreateOptions>;
/** Options of `workspaceLogs`: with `seq`, one command, its output cut to `maxOutputBytes`. */
export type LogsOptions = CamelCased<CoreLogsOptions>;
/** Options of `doctor`: `environment` adds a warm/cold/stale verdict for it. */
export type DoctorOptions = CamelCased<Pick<NonNullable<Parameters<typeof doctor>[1]>, "environment">>;
/** Options of `demo`. */
export type DemoOptions = CamelCased<NonNullable<Parameters<typeof demo>[1]>>;
/** Options of `prepare`: `force` proves the loop again even when nothing changed. */
export type PrepareOptions = CamelCased<NonNullable<Parameters<typeof prepare>[2]>>;
/** Options of `pullEnvironment`: `insecureRegistry` allows plain HTTP to a loopback registry. */
export interface PullOptions {
  signal?: AbortSignal;
  insecureRegistry?: boolean;
}
/** A recipe for `buildEnvironment` (contract §10): `copy` items are `SRC:DEST` or `{src, dest}`. */
export interface EnvironmentRecipe {
  name: string;
  from: string;
  apt?: string[];
  run?: string[];
  copy?: (string | { src: string; dest: string })[];
}
/** Options of `buildEnvironment`. */
export interface BuildEnvironmentOptions {
  signal?: AbortSignal;
}
/** Options of `pruneEnvironments`: `all` removes every cached environment, not only stale ones. */
export interface PruneOptions {
  all?: boolean;
}
/** The changes of `updateWorkspace`: `labels` are merged over the existing ones, `clearLabels` removed. */
export interface UpdateWorkspacePatch {
  name?: string;
  labels?: Record<string, string>;
  clearLabels?: string[];
  /** A new network policy; applies to the running workspace at once. */
  networkPolicy?: string;
}
/**
 * Options of `startService`: `readiness` is the probe (contract §5: `{type: "file"|"tcp"|
 * "http"|"command", path?, port?, url?, command?, timeout_seconds?}`; a file exists, a TCP
 * port accepts, an HTTP URL answers, a command succeeds; none: ready once started).
 */
export type StartServiceOptions = CamelCased<CoreStartServiceOptions>;
/** Options of `serviceLogs`: the last `tailLines` lines (default 100). */
export interface ServiceLogsOptions {
  tailLines?: number;
}
/** Options of `stopService`: seconds between TERM and KILL (default 5). */
export interface StopServiceOptions {
  graceSeconds?: number;
}
/** Options of `openShell`: working directory inside /workspace, terminal size (default 120x40). */
export interface OpenShellOptions {
  cwd?: string;
  cols?: number;
  rows?: number;
}
/** Options of `writeShell`: `newline: false` sends the input without pressing Enter. */
export interface WriteShellOptions {
  newline?: boolean;
}
/**
 * Options of `readShell`: `cursor` (default: where the last read ended), `plain` (the
 * rendered screen text, no control sequences), `waitForIdleMs` (wait until the shell has
 * printed nothing for this long, at most 10000), `maxWaitMs` (longest wait in all, default
 * 30000), `maxBytes` (raw bytes per read, default 65536).
 */
export interface ReadShellOptions {
  cursor?: number;
  plain?: boolean;
  waitForIdleMs?: number;
  maxWaitMs?: number;
  maxBytes?: number;
}
/** Options of `listWorkspaceFiles`. */
export interface ListFilesOptions {
  recursive?: boolean;
}
/** Options of `readWorkspaceFile` (`maxBytes`: default 1 MiB). */
export interface ReadFileOptions {
  maxBytes?: number;
}
/** Options of `diffWorkspace` and `resetWorkspace`: a snapshot name (default `baseline`, the seed). */
export interface SnapshotOptions {
  snapshot?: string;
}
/**
 * Options of `commitWorkspace`: the branch to create (default `pyro/<name or id>`), the
 * commit message, and `force` to move an existing branch.
 */
export interface CommitOptions {
  branch?: string;
  message?: string;
  force?: boolean;
  signal?: AbortSignal;
}
/** Options of `exportWorkspace`. */
export interface ExportOptions {
  signal?: AbortSignal;
}
/** Options of `syncPushWorkspace` (`dest`: default /workspace). */
export interface SyncPushOptions {
  dest?: string;
  signal?: AbortSignal;
}

// ---------------------------------------------------------------- pieces

/** Every key of T, each with a schema: `satisfies Keys<T>` fails to compile on a missing or extra key. */
type Keys<T> = { [K in keyof Required<T>]: z.ZodType };

const workspaceId = z
  .string()
  .min(1)
  .describe("the workspace's id (ws_ and 12 hex digits) or its unique name");
const environment = z.string().min(1).describe('an environment name or OCI reference, e.g. "debian:12"');
const command = z
  .string()
  .regex(/\S/, "must not be empty or blank")
  .describe('a shell command string, run as /bin/sh -c COMMAND, e.g. "make test"');
const workspacePath = z
  .string()
  .min(1)
  .describe("a path inside the workspace: relative to /workspace, or absolute under it");
const hostPath = z.string().min(1).describe("a path on the host");
const snapshotRef = z.string().min(1).describe("a snapshot name (default 'baseline', the seed)");
const snapshotName = z
  .string()
  .min(1)
  .max(63)
  .describe("a snapshot name: 1-63 letters, digits, '.', '_' or '-' ('baseline' is reserved)");
const workspaceName = z
  .string()
  .min(1)
  .max(63)
  .describe("a unique name: 1-63 letters, digits, '.', '_' or '-'");
const backend = z.enum(BACKEND_NAMES).describe(`a backend name: ${BACKEND_NAMES.join(", ")}`);
const flag = z.boolean().describe("true or false");
const networkPolicy = z
  .string()
  .min(1)
  .max(4096)
  .describe("off, egress or allowlist:HOST[,HOST...] (exact names, *.suffix, optional :PORT)");
const port = (min: number) => z.number().int().min(min).max(65535);
const publishedPorts = z
  .array(z.object({ host_port: port(0), guest_port: port(1) }).strict())
  .max(32)
  .describe(
    "an array of {host_port, guest_port}: 127.0.0.1:host_port reaches the guest port (0 picks a free one)",
  );
const networkTarget = z
  .string()
  .min(1)
  .max(300)
  .describe("a destination HOST[:PORT], as `networkBlocks` lists it");
const serviceName = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/, "must be 1-63 letters, digits, '.', '_' or '-'")
  .describe("a service name: 1-63 letters, digits, '.', '_' or '-', e.g. \"web\"");
const readyTimeoutSeconds = z
  .number()
  .positive()
  .max(LIMITS.timeout_seconds.max)
  .optional()
  .describe("a number of seconds to wait for readiness, more than 0 and at most 86400 (default 30)");
const readiness = z
  .discriminatedUnion("type", [
    z.strictObject({
      type: z.literal("file"),
      path: z.string().min(1),
      timeout_seconds: readyTimeoutSeconds,
    }),
    z.strictObject({ type: z.literal("tcp"), port: port(1), timeout_seconds: readyTimeoutSeconds }),
    z.strictObject({
      type: z.literal("http"),
      url: z.string().min(1).max(2048),
      timeout_seconds: readyTimeoutSeconds,
    }),
    z.strictObject({
      type: z.literal("command"),
      command: z.string().regex(/\S/, "must not be empty or blank"),
      timeout_seconds: readyTimeoutSeconds,
    }),
  ])
  .nullable()
  .describe(
    'a readiness probe (contract §5): {type: "file", path}, {type: "tcp", port}, {type: "http", url} or {type: "command", command}, each with an optional timeout_seconds (default 30); null: ready once started',
  );
const tailLines = z
  .number()
  .int()
  .min(1)
  .max(10_000)
  .describe("a whole number of lines from 1 to 10000 (default 100)");
const graceSeconds = z
  .number()
  .min(0)
  .max(60)
  .describe("seconds between TERM and KILL, from 0 to 60 (default 5)");
const timeoutSeconds = z
  .number()
  .positive()
  .max(LIMITS.timeout_seconds.max)
  .describe("a number of seconds, more than 0 and at most 86400 (default 300)");
const maxOutputBytes = z
  .number()
  .int()
  .min(MIN_OUTPUT_BYTES)
  .max(MAX_OUTPUT_BYTES)
  .describe(
    `a whole number of bytes per stream from ${MIN_OUTPUT_BYTES} to ${MAX_OUTPUT_BYTES} (default 1 MiB)`,
  );
const vcpus = z
  .number()
  .int()
  .min(LIMITS.vcpus.min)
  .max(LIMITS.vcpus.max)
  .describe("the number of virtual CPUs, a whole number from 1 to 64 (default 1)");
const memoryMib = z
  .number()
  .int()
  .min(LIMITS.memory_mib.min)
  .describe("the memory in MiB, a whole number of at least 64 (default 1024)");
const diskMib = z
  .number()
  .int()
  .min(LIMITS.disk_mib.min)
  .max(LIMITS.disk_mib.max)
  .describe("the disk limit in MiB, a whole number from 64 to 16777216 (default 10240)");
const ttlSeconds = z
  .number()
  .int()
  .positive()
  .nullable()
  .describe(
    "the seconds of inactivity before the workspace is deleted, a whole number above 0 (null: never)",
  );
const envVars = z
  .record(
    z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "environment variable names are letters, digits and _"),
    z.string(),
  )
  .describe('an object of environment variables {NAME: "value"}');
const secrets = z
  .record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "secret names are letters, digits and _"), z.string())
  // biome-ignore lint/suspicious/noTemplateCurlyInString: the ${HOST_VAR} syntax of secret specs, literally
  .describe('an object of secrets {NAME: spec}, a spec being a literal, "${HOST_VAR}" or "?" (prompted)');
const labels = z.record(z.string().min(1), z.string()).describe('an object of labels {key: "value"}');
const fn = z
  .custom<(...args: never[]) => unknown>((v) => typeof v === "function", { error: "must be a function" })
  .describe("a function");
const signal = z
  .custom<AbortSignal>((v) => v instanceof AbortSignal, { error: "must be an AbortSignal" })
  .describe("an AbortSignal, e.g. AbortSignal.timeout(60_000)");
const stdin = z
  .custom<AsyncIterable<Uint8Array>>(
    (v) =>
      typeof v === "object" &&
      v !== null &&
      typeof (v as { [Symbol.asyncIterator]?: unknown })[Symbol.asyncIterator] === "function",
    { error: "must be an async iterable of bytes (e.g. a Readable stream)" },
  )
  .describe("the command's stdin: an async iterable of bytes or a Readable stream");
const fileContent = z
  .custom<string | Uint8Array>((v) => typeof v === "string" || v instanceof Uint8Array, {
    error: "must be a string or a Buffer",
  })
  .describe("the file's new content: a string (UTF-8) or a Buffer/Uint8Array");
const seq = z.number().int().min(1).describe("a command number (1, 2, 3...) from execWorkspace or the logs");
const logLimit = z.number().int().min(1).max(1000).describe("a whole number of commands from 1 to 1000");
const shellId = z
  .string()
  .regex(/^sh_[0-9a-f]{12}$/, "shell ids look like sh_ and 12 hex digits")
  .describe("a shell id from openShell (sh_ and 12 hex digits)");
const cols = z.number().int().min(1).max(500).describe("terminal columns, a whole number from 1 to 500");
const rows = z.number().int().min(1).max(200).describe("terminal rows, a whole number from 1 to 200");
const shellInput = z
  .string()
  .max(64 * 1024)
  .describe("text to type into the shell, at most 65536 characters");
const shellSignal = z.enum(["INT", "TERM", "KILL"]).describe('"INT", "TERM" or "KILL"');
const cursor = z.number().int().min(0).describe("a byte cursor (next_cursor of an earlier read)");
const idleMs = z.number().int().min(0).max(10_000).describe("milliseconds from 0 to 10000");
const waitMs = z.number().int().min(0).max(60_000).describe("milliseconds from 0 to 60000 (default 30000)");
const readBytes = z
  .number()
  .int()
  .min(1)
  .max(1024 * 1024)
  .describe("a whole number of bytes from 1 to 1048576 (default 65536)");
const maxBytes = z
  .number()
  .int()
  .min(0)
  .max(16 * 1024 * 1024)
  .describe("a whole number of bytes from 0 to 16777216 (default 1 MiB)");

/**
 * A strict option object: every key optional, an unknown key refused. The SDK spells
 * option keys in camelCase only; a snake_case key is unknown, and the refusal's hint
 * names the camelCase spelling (validate.ts).
 */
function options<T extends Record<string, z.ZodType>>(shape: T) {
  const optional = Object.fromEntries(
    Object.entries(shape).map(([k, s]) => [k, s.optional().describe(s.description ?? "")]),
  ) as { [K in keyof T]: z.ZodOptional<T[K]> };
  return z.strictObject(optional);
}

// ---------------------------------------------------------------- the table

/** One positional argument: its name (as in the usage line), its schema, whether it may be left out. */
export interface Param {
  name: string;
  schema: z.ZodType;
  optional?: boolean;
}

const arg = (name: string, schema: z.ZodType): Param => ({ name, schema });
/** An argument with a default: the method substitutes it for `undefined` before the check. */
const opt = (name: string, schema: z.ZodType): Param => ({ name, schema, optional: true });

const runOptions = options({
  vcpus,
  memoryMib,
  diskMib,
  timeoutSeconds,
  maxOutputBytes,
  networkPolicy,
  backend,
  allowHostCompat: flag,
  env: envVars,
  seedPath: hostPath,
  signal,
  onOutput: fn,
  stdin,
  onProgress: fn,
} satisfies Keys<RunOptions>);

const createOptions = options({
  environment,
  seedPath: hostPath,
  repoUrl: z.string().min(1).describe("a Git repository URL to clone"),
  repoRef: z.string().min(1).describe("a branch, tag or commit of repoUrl"),
  name: workspaceName,
  labels,
  networkPolicy,
  publishedPorts,
  env: envVars,
  secrets,
  promptSecret: fn,
  onProgress: fn,
  backend,
  allowHostCompat: flag,
  vcpus,
  memoryMib,
  diskMib,
  ttlSeconds,
  signal,
} satisfies Keys<CreateWorkspaceOptions>);

const execOptions = options({
  timeoutSeconds,
  cwd: workspacePath,
  env: envVars,
  maxOutputBytes,
  signal,
  onOutput: fn,
  stdin,
} satisfies Keys<ExecOptions>);

const demoShape = { backend, allowHostCompat: flag } satisfies Keys<DemoOptions>;
const snapshotOptions = options({ snapshot: snapshotRef } satisfies Keys<SnapshotOptions>);

/**
 * Every public method that takes arguments, with its parameters in order. A method
 * missing here cannot validate; tests/unit/sdk pins that the table covers `Pyro`.
 */
export const SIGNATURES = {
  doctor: [opt("options", options({ environment } satisfies Keys<DoctorOptions>))],
  pullEnvironment: [
    arg("name", environment),
    opt("options", options({ signal, insecureRegistry: flag } satisfies Keys<PullOptions>)),
  ],
  buildEnvironment: [
    arg(
      "recipe",
      z
        .strictObject({
          name: z.string().min(1),
          from: environment,
          apt: z.array(z.string().min(1)).optional(),
          run: z.array(z.string().min(1)).optional(),
          copy: z
            .array(
              z.union([
                z.string().min(3),
                z.strictObject({ src: z.string().min(1), dest: z.string().min(1) }),
              ]),
            )
            .optional(),
        })
        .describe("a recipe {name, from, apt?, run?, copy?}"),
    ),
    opt("options", options({ signal } satisfies Keys<BuildEnvironmentOptions>)),
  ],
  inspectEnvironment: [arg("name", environment)],
  pruneEnvironments: [opt("options", options({ all: flag } satisfies Keys<PruneOptions>))],
  run: [arg("environment", environment), arg("command", command), opt("options", runOptions)],
  demo: [opt("options", options(demoShape))],
  prepare: [
    arg("environment", environment),
    opt("options", options({ ...demoShape, force: flag } satisfies Keys<PrepareOptions>)),
  ],
  createWorkspace: [opt("options", createOptions)],
  getWorkspace: [arg("workspaceId", workspaceId)],
  updateWorkspace: [
    arg("workspaceId", workspaceId),
    arg(
      "patch",
      options({
        name: workspaceName,
        labels,
        clearLabels: z.array(z.string().min(1)).describe("an array of label keys to remove"),
        networkPolicy,
      } satisfies Keys<UpdateWorkspacePatch>),
    ),
  ],
  deleteWorkspace: [arg("workspaceId", workspaceId)],
  networkBlocks: [arg("workspaceId", workspaceId)],
  approveNetwork: [arg("workspaceId", workspaceId), arg("target", networkTarget)],
  stopWorkspace: [arg("workspaceId", workspaceId)],
  startWorkspace: [arg("workspaceId", workspaceId)],
  execWorkspace: [arg("workspaceId", workspaceId), arg("command", command), opt("options", execOptions)],
  workspaceLogs: [
    arg("workspaceId", workspaceId),
    opt("options", options({ limit: logLimit, seq, maxOutputBytes } satisfies Keys<LogsOptions>)),
  ],
  summarizeWorkspace: [arg("workspaceId", workspaceId)],
  startService: [
    arg("workspaceId", workspaceId),
    arg("name", serviceName),
    arg("command", command),
    opt(
      "options",
      options({
        readiness,
        cwd: workspacePath,
        env: envVars,
      } satisfies Keys<StartServiceOptions>),
    ),
  ],
  listServices: [arg("workspaceId", workspaceId)],
  serviceStatus: [arg("workspaceId", workspaceId), arg("name", serviceName)],
  serviceLogs: [
    arg("workspaceId", workspaceId),
    arg("name", serviceName),
    opt("options", options({ tailLines } satisfies Keys<ServiceLogsOptions>)),
  ],
  stopService: [
    arg("workspaceId", workspaceId),
    arg("name", serviceName),
    opt("options", options({ graceSeconds } satisfies Keys<StopServiceOptions>)),
  ],
  openShell: [
    arg("workspaceId", workspaceId),
    opt("options", options({ cwd: workspacePath, cols, rows } satisfies Keys<OpenShellOptions>)),
  ],
  writeShell: [
    arg("workspaceId", workspaceId),
    arg("shellId", shellId),
    arg("input", shellInput),
    opt("options", options({ newline: flag } satisfies Keys<WriteShellOptions>)),
  ],
  readShell: [
    arg("workspaceId", workspaceId),
    arg("shellId", shellId),
    opt(
      "options",
      options({
        cursor,
        plain: flag,
        waitForIdleMs: idleMs,
        maxWaitMs: waitMs,
        maxBytes: readBytes,
      } satisfies Keys<ReadShellOptions>),
    ),
  ],
  signalShell: [arg("workspaceId", workspaceId), arg("shellId", shellId), arg("signal", shellSignal)],
  resizeShell: [
    arg("workspaceId", workspaceId),
    arg("shellId", shellId),
    arg("cols", cols),
    arg("rows", rows),
  ],
  closeShell: [arg("workspaceId", workspaceId), arg("shellId", shellId)],
  listShells: [arg("workspaceId", workspaceId)],
  listWorkspaceFiles: [
    arg("workspaceId", workspaceId),
    opt("path", workspacePath),
    opt("options", options({ recursive: flag } satisfies Keys<ListFilesOptions>)),
  ],
  readWorkspaceFile: [
    arg("workspaceId", workspaceId),
    arg("path", workspacePath),
    opt("options", options({ maxBytes } satisfies Keys<ReadFileOptions>)),
  ],
  writeWorkspaceFile: [
    arg("workspaceId", workspaceId),
    arg("path", workspacePath),
    arg("content", fileContent),
  ],
  applyWorkspacePatch: [
    arg("workspaceId", workspaceId),
    arg("patch", z.string().min(1).describe("a unified diff or a *** Begin Patch envelope, as a string")),
  ],
  diffWorkspace: [arg("workspaceId", workspaceId), opt("options", snapshotOptions)],
  exportWorkspace: [
    arg("workspaceId", workspaceId),
    arg("path", workspacePath),
    arg("outputPath", hostPath),
    opt("options", options({ signal } satisfies Keys<ExportOptions>)),
  ],
  commitWorkspace: [
    arg("workspaceId", workspaceId),
    opt(
      "options",
      options({
        branch: z.string().min(1).describe("the branch to create, e.g. pyro/fix-login"),
        message: z.string().min(1).describe("the commit message"),
        force: flag,
        signal,
      } satisfies Keys<CommitOptions>),
    ),
  ],
  listWorkspaceDisk: [
    arg("workspaceId", workspaceId),
    opt("path", workspacePath),
    opt("options", options({ recursive: flag } satisfies Keys<ListFilesOptions>)),
  ],
  readWorkspaceDisk: [
    arg("workspaceId", workspaceId),
    arg("path", workspacePath),
    opt("options", options({ maxBytes } satisfies Keys<ReadFileOptions>)),
  ],
  exportWorkspaceDisk: [
    arg("workspaceId", workspaceId),
    arg("path", workspacePath),
    arg("outputPath", hostPath),
    opt("options", options({ signal } satisfies Keys<ExportOptions>)),
  ],
  syncPushWorkspace: [
    arg("workspaceId", workspaceId),
    arg("source", hostPath),
    opt("options", options({ dest: workspacePath, signal } satisfies Keys<SyncPushOptions>)),
  ],
  resetWorkspace: [arg("workspaceId", workspaceId), opt("options", snapshotOptions)],
  createSnapshot: [arg("workspaceId", workspaceId), arg("name", snapshotName)],
  listSnapshots: [arg("workspaceId", workspaceId)],
  deleteSnapshot: [arg("workspaceId", workspaceId), arg("name", snapshotName)],
} satisfies Record<string, readonly Param[]>;

export type CheckedMethod = keyof typeof SIGNATURES;
