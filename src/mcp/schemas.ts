/**
 * Zod schemas shared by the MCP tools: argument pieces (with descriptions written for a
 * model) and the result objects. Results are the SDK's snake_case objects unchanged; the
 * schemas pin the contract's fields and stay loose (extra fields pass) so the core can
 * add fields without breaking clients that validate.
 */
import { z } from "zod";
import { LIMITS } from "../core/limits.js";
import { BACKEND_NAMES, DEFAULT_ENVIRONMENT, OFFICIAL_ENVIRONMENTS } from "../core/vocabulary.js";
import { ERROR_CODES } from "../errors.js";

// ---------------------------------------------------------------- arguments

/**
 * Input limits: every string, record and array a tool takes is bounded, so no argument can
 * make the server slow, huge or crash (docs/mcp.md, "Limits"). Sizes of file contents,
 * patches and commands are in UTF-8 bytes; the rest in characters.
 */
export const INPUT_LIMITS = {
  id: 128,
  environment: 128,
  path: 4096,
  /** One argv string (Linux's MAX_ARG_STRLEN, the command is passed to `sh -c`). */
  commandBytes: 128 * 1024 - 1,
  textBytes: 16 * 1024 * 1024,
  patchBytes: 16 * 1024 * 1024,
  envEntries: 256,
  envValueBytes: 128 * 1024 - 1,
  labelEntries: 64,
  labelKey: 63,
  labelValue: 256,
  secretEntries: 64,
  secretValueBytes: 64 * 1024,
  networkPolicy: 4096,
} as const;

const noNul = (s: string) => !s.includes("\0");

/** A string of at most `max` characters with no NUL byte (paths, ids, names). */
export function boundedString(max: number, what: string, min = 1) {
  return z
    .string()
    .min(min, `${what} cannot be empty`)
    .max(max, `${what} is limited to ${max} characters`)
    .refine(noNul, `${what} cannot contain a NUL byte`);
}

/** A string of at most `max` UTF-8 bytes. */
export function byteBoundedString(max: number, what: string, min = 0, nul = false) {
  const s = z
    .string()
    .min(min, `${what} cannot be empty`)
    .max(max, `${what} is limited to ${max} bytes`)
    .refine((v) => Buffer.byteLength(v) <= max, `${what} is limited to ${max} bytes`);
  return nul ? s : s.refine(noNul, `${what} cannot contain a NUL byte`);
}

/** A record with at most `max` entries. */
function boundedRecord<K extends z.ZodType<string>, V extends z.ZodType>(
  key: K,
  value: V,
  max: number,
  what: string,
) {
  return z.record(key, value).refine((r) => Object.keys(r).length <= max, `at most ${max} ${what}`);
}

export const workspaceIdArg = boundedString(INPUT_LIMITS.id, "workspace_id").describe(
  "The workspace: its id (ws_ followed by 12 hex digits) or its unique name.",
);

export const environmentArg = boundedString(INPUT_LIMITS.environment, "environment").describe(
  `Environment (root filesystem) to start from; default ${DEFAULT_ENVIRONMENT}. Official: ${OFFICIAL_ENVIRONMENTS.map((e) => e.name).join(", ")}.`,
);

export const backendArg = z
  .enum(BACKEND_NAMES)
  .describe(
    "Isolation backend; omit it to get the strongest one that works on this host. 'host' (no isolation) works only when the server was started with --allow-host-compat.",
  );

export const commandArg = byteBoundedString(INPUT_LIMITS.commandBytes, "command", 1).describe(
  "Shell command string, run as `/bin/sh -c COMMAND` (pipes, && and quoting work as in a shell).",
);

export const vcpusArg = z
  .number()
  .int()
  .min(LIMITS.vcpus.min)
  .max(LIMITS.vcpus.max)
  .describe("Virtual CPUs (default 1).");

export const memoryArg = z
  .number()
  .int()
  .min(LIMITS.memory_mib.min)
  .max(LIMITS.memory_mib.max)
  .describe("Memory limit in MiB (default 1024).");

export const diskArg = z
  .number()
  .int()
  .min(LIMITS.disk_mib.min)
  .max(LIMITS.disk_mib.max)
  .describe(
    "Disk limit in MiB for what commands write (default 10240); commands past it see ENOSPC. Only where the backend enforces it (bwrap, gvisor, qemu, firecracker); elsewhere refused.",
  );

export const timeoutArg = z
  .number()
  .positive()
  .max(LIMITS.timeout_seconds.max)
  .describe(
    "Seconds before the command's whole process tree is killed (default 300); the result then has timed_out: true.",
  );

export const envArg = boundedRecord(
  z
    .string()
    .max(256)
    .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "environment variable names are letters, digits and _"),
  byteBoundedString(INPUT_LIMITS.envValueBytes, "an environment variable's value"),
  INPUT_LIMITS.envEntries,
  "environment variables",
).describe("Environment variables for the command(s), as an object {NAME: value}.");

export const labelKeyArg = boundedString(INPUT_LIMITS.labelKey, "a label key");

export const labelsArg = boundedRecord(
  labelKeyArg,
  boundedString(INPUT_LIMITS.labelValue, "a label value", 0),
  INPUT_LIMITS.labelEntries,
  "labels",
).describe('Labels as an object {key: value}, e.g. {"task": "issue-42"}.');

export const workspacePathArg = boundedString(INPUT_LIMITS.path, "path").describe(
  "Path inside the workspace: relative to /workspace, or absolute under /workspace. Paths that leave /workspace are refused.",
);

/** A host path argument (seed_path, output_path, source_path); described by the tool. */
export const hostPathArg = boundedString(INPUT_LIMITS.path, "a host path");

export const snapshotArg = boundedString(INPUT_LIMITS.id, "snapshot").describe(
  "Snapshot name; default 'baseline' (the seed the workspace was created from).",
);

export const hostPathNote =
  "Host path inside the server's project directory (or a directory the user allowed with --allow-host-path); a relative path is resolved against the project directory. Paths elsewhere, or through symlinks that lead out, are refused (path_outside_workspace).";

// ---------------------------------------------------------------- results

export const errorObject = z.object({
  code: z.enum(ERROR_CODES),
  message: z.string(),
  hint: z.string().optional(),
});

/** What a failed call returns as structuredContent. */
export const errorResult = z.object({ error: errorObject });

const timestamp = z.string();
const count = z.number().int().min(0);

export const workspaceSeed = z.looseObject({
  kind: z.enum(["directory", "git", "empty"]),
  source: z.string().nullable(),
  ref: z.string().optional(),
  commit: z.string().optional(),
  file_count: count,
  bytes: count,
});

export const executionMode = z.enum(["guest_agent", "host_compat"]);

const workspaceState = z.enum(["creating", "running", "stopped", "error", "deleting"]);

/** create / status / update / stop / start: the workspace view. */
export const workspaceShape = {
  workspace_id: z.string(),
  name: z.string().nullable(),
  labels: z.record(z.string(), z.string()),
  environment: z.string(),
  backend: z.enum(BACKEND_NAMES),
  execution_mode: executionMode,
  state: workspaceState,
  network_policy: z.string(),
  created_at: timestamp,
  last_activity_at: timestamp,
  expires_at: timestamp.nullable(),
  workspace_seed: workspaceSeed,
  current_snapshot: z.string().nullable(),
  reset_count: count,
  limits: z.looseObject({ vcpus: z.number(), memory_mib: z.number(), pids_max: z.number().nullable() }),
  error: z.looseObject({ code: z.string(), message: z.string(), hint: z.string().optional() }).nullable(),
  published_ports: z.array(z.looseObject({ host_port: z.number(), guest_port: z.number() })).optional(),
  /** Names and kinds only, never values. */
  secrets: z.array(z.looseObject({ name: z.string(), kind: z.string() })).optional(),
};
export const workspaceObject = z.looseObject(workspaceShape);

/** How the server chose a default seed (present only when `seed_path` was omitted and a default exists). */
export const defaultSeedObject = z.looseObject({
  origin: z.enum(["cwd", "project_path", "repo_url"]),
  path: z.string(),
  repo_url: z.string().optional(),
  repo_ref: z.string().optional(),
  commit: z.string().optional(),
});

export const listItem = z.looseObject({
  workspace_id: z.string(),
  name: z.string().nullable(),
  labels: z.record(z.string(), z.string()),
  environment: z.string(),
  backend: z.enum(BACKEND_NAMES),
  state: workspaceState,
  created_at: timestamp,
  last_activity_at: timestamp,
  expires_at: timestamp.nullable(),
  command_count: count,
  service_count: count,
  running_service_count: count,
});

export const changeEntry = z.looseObject({
  path: z.string(),
  status: z.enum(["added", "modified", "deleted"]),
});
export const diffSummary = z.looseObject({ total: count, added: count, modified: count, deleted: count });

export const fileEntry = z.looseObject({
  path: z.string(),
  artifact_type: z.enum(["file", "directory", "symlink", "other"]),
  size_bytes: count,
  link_target: z.string().nullable(),
});

export const snapshotObject = z.looseObject({
  workspace_id: z.string(),
  snapshot_name: z.string(),
  kind: z.string(),
  created_at: timestamp,
  size_bytes: count,
  file_count: count,
});

/**
 * The outputSchema a tool advertises: the success object, plus an optional `error`
 * member, with "either the success fields or `error`" expressed as JSON Schema `anyOf`.
 *
 * Why: failures are results whose structuredContent is `{error: {...}}` (CONTRACT §7),
 * and MCP clients (the official SDK's among them) validate any structuredContent against
 * the advertised outputSchema, error results included. A schema that only described
 * success would make every error result a client-side validation failure. The zod
 * object below is only used to render the JSON Schema; the server validates successes
 * with the strict success schema and errors with `errorResult`.
 */
export function advertisedOutput(success: z.ZodObject): z.ZodObject {
  const required = Object.entries(success.shape)
    .filter(([, s]) => !(s as z.ZodType).safeParse(undefined).success)
    .map(([k]) => k);
  // A workspace view has an `error` of its own (why the workspace is in the error state,
  // or null): that member admits both shapes. `isError` is what tells a failed call.
  const own = success.shape.error as z.ZodType | undefined;
  const error = own ? z.union([own, errorObject]) : errorObject.optional();
  return z
    .looseObject({ ...success.shape, error })
    .meta({ anyOf: [{ required }, { required: ["error"] }], required: undefined });
}
