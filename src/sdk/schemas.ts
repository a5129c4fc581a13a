/**
 * The SDK's argument contract: a zod schema for every argument of every public `Pyro`
 * method, with the ranges the MCP tools accept for the same operations. `Pyro` checks its
 * arguments against this table before it does anything (validate.ts), so a wrong type is
 * an `invalid_argument` PyroError naming the method and the argument, never a TypeError
 * from deep inside the core.
 *
 * Option objects are strict: an unknown key is refused, not ignored, because a misspelt
 * option (`timeout` for `timeoutSeconds`) would otherwise silently do nothing. Each option
 * schema is checked against the method's declared option type at compile time (`Keys<T>`),
 * so an option added to a core type cannot be forgotten here.
 *
 * These schemas live in the SDK rather than reusing src/mcp/schemas.ts: the MCP layer sits
 * on top of the SDK, and its descriptions are written for a model, not a programmer.
 */
import { z } from "zod";
import type { ExecOptions } from "../core/exec.js";
import type { RunOptions } from "../core/oneshot.js";
import { MAX_OUTPUT_BYTES, MIN_OUTPUT_BYTES } from "../core/output.js";
import { BACKEND_NAMES, type BackendName } from "../core/vocabulary.js";
import type { CreateOptions } from "../core/workspaces.js";

// ---------------------------------------------------------------- option types

/** `maxOutputBytes` (or `max_output_bytes`): per stream; past it a stream keeps its head and tail. */
export type RunCallOptions = Omit<RunOptions, "environment"> & { maxOutputBytes?: number };
export type ExecCallOptions = ExecOptions & { timeoutSeconds?: number; maxOutputBytes?: number };
export type CreateCallOptions = CreateOptions & {
  promptSecret?: import("../core/secrets.js").SecretPrompt;
  allowHostCompat?: boolean;
  seedPath?: string;
  repoUrl?: string;
  repoRef?: string;
  networkPolicy?: string;
};
export interface DoctorCallOptions {
  environment?: string;
}
export interface PullCallOptions {
  signal?: AbortSignal;
}
export interface PruneCallOptions {
  all?: boolean;
}
export interface DemoCallOptions {
  backend?: BackendName;
  allowHostCompat?: boolean;
}
export interface PrepareCallOptions extends DemoCallOptions {
  force?: boolean;
}
export interface UpdateCallPatch {
  name?: string;
  labels?: Record<string, string>;
  clearLabels?: string[];
}
export interface LogsCallOptions {
  limit?: number;
  seq?: number;
  maxOutputBytes?: number;
}
export interface ListFilesCallOptions {
  recursive?: boolean;
}
export interface ReadFileCallOptions {
  maxBytes?: number;
}
export interface SnapshotCallOptions {
  snapshot?: string;
}
export interface ExportCallOptions {
  signal?: AbortSignal;
}
export interface SyncPushCallOptions {
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
const networkPolicy = z.string().describe("off, egress or allowlist:HOST[,HOST...]");
const timeoutSeconds = z
  .number()
  .positive()
  .max(86_400)
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
  .min(1)
  .max(64)
  .describe("the number of virtual CPUs, a whole number from 1 to 64 (default 1)");
const memoryMib = z
  .number()
  .int()
  .min(64)
  .describe("the memory in MiB, a whole number of at least 64 (default 1024)");
const diskMib = z
  .number()
  .int()
  .min(64)
  .max(16 * 1024 * 1024)
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
const maxBytes = z
  .number()
  .int()
  .min(0)
  .max(16 * 1024 * 1024)
  .describe("a whole number of bytes from 0 to 16777216 (default 1 MiB)");

/**
 * A strict option object. `aliases` are pairs of names for one option (the SDK takes the
 * camelCase and the snake_case spelling): giving both is refused rather than letting one
 * silently win.
 */
function options<T extends Record<string, z.ZodType>>(shape: T, aliases: [string, string][] = []) {
  const optional = Object.fromEntries(
    Object.entries(shape).map(([k, s]) => [k, s.optional().describe(s.description ?? "")]),
  ) as { [K in keyof T]: z.ZodOptional<T[K]> };
  return z.strictObject(optional).superRefine((o: Record<string, unknown>, ctx) => {
    for (const [a, b] of aliases) {
      if (o[a] !== undefined && o[b] !== undefined)
        ctx.addIssue({ code: "custom", path: [b], message: "alias", params: { alias: a } });
    }
  });
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

const runOptions = options(
  {
    vcpus,
    memory_mib: memoryMib,
    disk_mib: diskMib,
    timeout_seconds: timeoutSeconds,
    max_output_bytes: maxOutputBytes,
    maxOutputBytes,
    network_policy: networkPolicy,
    backend,
    allow_host_compat: flag,
    env: envVars,
    seed_path: hostPath,
    signal,
    on_output: fn,
    stdin,
    on_progress: fn,
  } satisfies Keys<RunCallOptions>,
  [["maxOutputBytes", "max_output_bytes"]],
);

const createOptions = options(
  {
    environment,
    seed_path: hostPath,
    seedPath: hostPath,
    repo_url: z.string().min(1).describe("a Git repository URL to clone"),
    repoUrl: z.string().min(1).describe("a Git repository URL to clone"),
    repo_ref: z.string().min(1).describe("a branch, tag or commit of repoUrl"),
    repoRef: z.string().min(1).describe("a branch, tag or commit of repoUrl"),
    name: workspaceName,
    labels,
    network_policy: networkPolicy,
    networkPolicy,
    env: envVars,
    secrets,
    prompt_secret: fn,
    promptSecret: fn,
    on_progress: fn,
    backend,
    allow_host_compat: flag,
    allowHostCompat: flag,
    vcpus,
    memory_mib: memoryMib,
    disk_mib: diskMib,
    ttl_seconds: ttlSeconds,
    signal,
  } satisfies Keys<CreateCallOptions>,
  [
    ["seedPath", "seed_path"],
    ["repoUrl", "repo_url"],
    ["repoRef", "repo_ref"],
    ["networkPolicy", "network_policy"],
    ["promptSecret", "prompt_secret"],
    ["allowHostCompat", "allow_host_compat"],
  ],
);

const execOptions = options(
  {
    timeout_seconds: timeoutSeconds,
    timeoutSeconds,
    cwd: workspacePath,
    env: envVars,
    max_output_bytes: maxOutputBytes,
    maxOutputBytes,
    signal,
    on_output: fn,
    stdin,
  } satisfies Keys<ExecCallOptions>,
  [
    ["timeoutSeconds", "timeout_seconds"],
    ["maxOutputBytes", "max_output_bytes"],
  ],
);

const demoShape = { backend, allowHostCompat: flag } satisfies Keys<DemoCallOptions>;
const snapshotOptions = options({ snapshot: snapshotRef } satisfies Keys<SnapshotCallOptions>);

/**
 * Every public method that takes arguments, with its parameters in order. A method
 * missing here cannot validate; tests/unit/sdk pins that the table covers `Pyro`.
 */
export const SIGNATURES = {
  doctor: [opt("options", options({ environment } satisfies Keys<DoctorCallOptions>))],
  pullEnvironment: [
    arg("name", environment),
    opt("options", options({ signal } satisfies Keys<PullCallOptions>)),
  ],
  inspectEnvironment: [arg("name", environment)],
  pruneEnvironments: [opt("options", options({ all: flag } satisfies Keys<PruneCallOptions>))],
  run: [arg("environment", environment), arg("command", command), opt("options", runOptions)],
  demo: [opt("options", options(demoShape))],
  prepare: [
    arg("environment", environment),
    opt("options", options({ ...demoShape, force: flag } satisfies Keys<PrepareCallOptions>)),
  ],
  createWorkspace: [opt("options", createOptions)],
  getWorkspace: [arg("workspaceId", workspaceId)],
  workspaceStatus: [arg("workspaceId", workspaceId)],
  updateWorkspace: [
    arg("workspaceId", workspaceId),
    arg(
      "patch",
      options({
        name: workspaceName,
        labels,
        clearLabels: z.array(z.string().min(1)).describe("an array of label keys to remove"),
      } satisfies Keys<UpdateCallPatch>),
    ),
  ],
  deleteWorkspace: [arg("workspaceId", workspaceId)],
  stopWorkspace: [arg("workspaceId", workspaceId)],
  startWorkspace: [arg("workspaceId", workspaceId)],
  execWorkspace: [arg("workspaceId", workspaceId), arg("command", command), opt("options", execOptions)],
  workspaceLogs: [
    arg("workspaceId", workspaceId),
    opt("options", options({ limit: logLimit, seq, maxOutputBytes } satisfies Keys<LogsCallOptions>)),
  ],
  summarizeWorkspace: [arg("workspaceId", workspaceId)],
  listWorkspaceFiles: [
    arg("workspaceId", workspaceId),
    opt("path", workspacePath),
    opt("options", options({ recursive: flag } satisfies Keys<ListFilesCallOptions>)),
  ],
  readWorkspaceFile: [
    arg("workspaceId", workspaceId),
    arg("path", workspacePath),
    opt("options", options({ maxBytes } satisfies Keys<ReadFileCallOptions>)),
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
    opt("options", options({ signal } satisfies Keys<ExportCallOptions>)),
  ],
  syncPushWorkspace: [
    arg("workspaceId", workspaceId),
    arg("source", hostPath),
    opt("options", options({ dest: workspacePath, signal } satisfies Keys<SyncPushCallOptions>)),
  ],
  resetWorkspace: [arg("workspaceId", workspaceId), opt("options", snapshotOptions)],
  createSnapshot: [arg("workspaceId", workspaceId), arg("name", snapshotName)],
  listSnapshots: [arg("workspaceId", workspaceId)],
  deleteSnapshot: [arg("workspaceId", workspaceId), arg("name", snapshotName)],
} satisfies Record<string, readonly Param[]>;

export type CheckedMethod = keyof typeof SIGNATURES;
