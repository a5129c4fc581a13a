import { z } from "zod";
import { LIMITS } from "../../core/limits.js";
import { PyroError } from "../../errors.js";
import {
  backendArg,
  boundedString,
  byteBoundedString,
  defaultSeedObject,
  diskArg,
  envArg,
  environmentArg,
  hostPathArg,
  hostPathNote,
  INPUT_LIMITS,
  labelKeyArg,
  labelsArg,
  listItem,
  memoryArg,
  vcpusArg,
  workspaceIdArg,
  workspaceObject,
  workspaceShape,
} from "../schemas.js";
import type { DefaultSeedInfo } from "../seed.js";
import { defineTool, ifOffered, mutating, READ_ONLY, sentences } from "../tool.js";
import { defined, ensureEnvironment, renderWorkspace } from "./common.js";

const createOutput = z.looseObject({ ...workspaceShape, default_seed: defaultSeedObject.optional() });

/**
 * workspace_create. `fullCreate` (the workspace-full profile) adds `network_policy`,
 * `published_ports` and `secrets`: elsewhere those arguments are not offered, workspaces
 * have no network, no published ports and no secrets.
 */
export function workspaceCreate(fullCreate: boolean) {
  const base = {
    environment: environmentArg.optional(),
    seed_path: hostPathArg
      .optional()
      .describe(
        `Directory or Git checkout to copy into /workspace (a checkout contributes its tracked files). Omit it to use the server's default seed. ${hostPathNote}`,
      ),
    name: z
      .string()
      .min(1)
      .max(63)
      .optional()
      .describe(
        "Unique name (letters, digits, '.', '_', '-') to address the workspace by instead of its id.",
      ),
    labels: labelsArg.optional(),
    env: envArg
      .optional()
      .describe("Environment variables for every command of this workspace, as {NAME: value}."),
    backend: backendArg.optional(),
    vcpus: vcpusArg.optional(),
    memory_mib: memoryArg.optional(),
    disk_mib: diskArg.optional(),
    ttl_seconds: z
      .number()
      .int()
      .positive()
      .max(LIMITS.ttl_seconds.max)
      .optional()
      .describe("Seconds of inactivity after which the workspace is deleted (default 86400, one day)."),
  };
  const full = {
    secrets: z
      .record(
        z
          .string()
          .max(256)
          .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "secret names are letters, digits and _"),
        byteBoundedString(INPUT_LIMITS.secretValueBytes, "a secret", 0),
      )
      .refine(
        (r) => Object.keys(r).length <= INPUT_LIMITS.secretEntries,
        `at most ${INPUT_LIMITS.secretEntries} secrets`,
      )
      .optional()
      .describe(
        // biome-ignore lint/suspicious/noTemplateCurlyInString: the ${HOST_VAR} syntax of secret specs, literally
        "Secrets as {NAME: spec}: a literal value, or '${HOST_VAR}' to take the value of a variable of the server's environment. They reach every command as environment variables and are redacted from outputs, logs and summaries. '?' (prompt) is not available over MCP.",
      ),
    network_policy: boundedString(INPUT_LIMITS.networkPolicy, "network_policy")
      .optional()
      .describe(
        "Network policy: 'off' (default, no network at all), 'egress' (public destinations through a proxy; package managers, git and curl use it by themselves) or 'allowlist:HOST,...' (only those hosts: exact names, *.suffix, optional :PORT). Refused destinations are listed by workspace_network_blocks; only a human can approve one.",
      ),
    published_ports: z
      .array(
        z.strictObject({
          host_port: z
            .number()
            .int()
            .min(0)
            .max(65535)
            .describe("Port on the host's 127.0.0.1; 0 picks a free one."),
          guest_port: z.number().int().min(1).max(65535).describe("Port inside the workspace."),
        }),
      )
      .max(32)
      .optional()
      .describe(
        "Ports to reach from the host: 127.0.0.1:host_port forwards to guest_port inside (under every policy). The result's published_ports has the ports as bound.",
      ),
  };
  return defineTool({
    name: "workspace_create",
    title: "Create workspace",
    description: (d) =>
      sentences(
        "Create a persistent, isolated Linux workspace: a sandbox whose working directory /workspace holds a copy of the project, and return its workspace_id.",
        "Files, installed packages and history persist across calls until workspace_delete; nothing it runs touches the host.",
        `Omit seed_path to use this server's default seed: ${d.defaultSeed}. The result's workspace_seed says what was copied.`,
        "Give it a name to address it by name later and to run several workspaces side by side.",
        ifOffered(d, "vm_run", "For a single command that needs no project files, vm_run is lighter."),
      ),
    next: [
      ["workspace_exec", "reproduce the problem (run the tests)"],
      ["workspace_file_list", "look around"],
      ["workspace_file_read", "read a file"],
      ["workspace_patch_apply", "fix it with a unified diff"],
    ],
    input: z.strictObject(fullCreate ? { ...base, ...full } : base),
    output: createOutput,
    annotations: mutating({ destructive: false, idempotent: false }),
    long: "creating the workspace",
    async run(a, ctx) {
      let seedPath = a.seed_path !== undefined ? await ctx.hostPath(a.seed_path, "read") : undefined;
      let fromDefault: DefaultSeedInfo | null = null;
      if (seedPath === undefined) {
        ctx.progress.report("resolving the default seed");
        fromDefault = await ctx.seed.resolve(ctx.signal);
        seedPath = fromDefault?.path;
      }
      await ensureEnvironment(ctx, a.environment, a.backend);
      ctx.progress.report("starting the sandbox");
      const { network_policy, published_ports, secrets } = a as {
        network_policy?: string;
        published_ports?: { host_port: number; guest_port: number }[];
        secrets?: Record<string, string>;
      };
      const w = await ctx.ws.create({
        ...defined({
          environment: a.environment,
          seed_path: seedPath,
          name: a.name,
          labels: a.labels,
          env: a.env,
          backend: a.backend,
          vcpus: a.vcpus,
          memory_mib: a.memory_mib,
          disk_mib: a.disk_mib,
          ttl_seconds: a.ttl_seconds,
          network_policy,
          published_ports,
          secrets,
        }),
        allow_host_compat: ctx.allowHostCompat,
        signal: ctx.signal,
      });
      return fromDefault ? { ...w, default_seed: fromDefault } : w;
    },
    render: (w) =>
      `${renderWorkspace(w)}${"default_seed" in w && w.default_seed ? `\nseeded from the server's default (${w.default_seed.origin}): ${w.default_seed.repo_url ?? w.default_seed.path}` : ""}`,
  });
}

/** Default and largest page of workspace_list. */
export const LIST_PAGE = 100;

export const workspaceList = defineTool({
  name: "workspace_list",
  title: "List workspaces",
  description: `List every workspace on this machine (made by any client: this server, the CLI, the SDK), most recent activity first, with name, labels, state, backend and command count. Use it to find a workspace to resume by name or label; workspace_status shows one workspace in detail. At most limit (default ${LIST_PAGE}) per call: when next_cursor is not null, pass it back as cursor for the next page.`,
  next: [["workspace_status", "details of one workspace"]],
  input: z.strictObject({
    limit: z
      .number()
      .int()
      .min(1)
      .max(LIST_PAGE)
      .optional()
      .describe(`At most this many workspaces (default ${LIST_PAGE}).`),
    cursor: z
      .string()
      .max(512)
      .optional()
      .describe("The next_cursor of a previous workspace_list: the page after it."),
  }),
  output: z.looseObject({
    count: z.number().int().min(0),
    workspaces: z.array(listItem),
    next_cursor: z.string().nullable(),
  }),
  annotations: READ_ONLY,
  async run(a, ctx) {
    const all = await ctx.ws.list();
    return pageWorkspaces(all.workspaces, a.cursor, a.limit ?? LIST_PAGE);
  },
  render: (r) =>
    r.count === 0
      ? "no workspaces"
      : [
          `${r.count} workspace(s)${r.workspaces.length < r.count ? `, ${r.workspaces.length} shown` : ""}, most recent activity first:`,
          ...r.workspaces.map((w) => {
            const labels = Object.entries(w.labels)
              .map(([k, v]) => `${k}=${v}`)
              .join(",");
            return `- ${w.workspace_id}${w.name ? ` (${w.name})` : ""}: ${w.state}, ${w.environment} on ${w.backend}, ${w.command_count} command(s), last activity ${w.last_activity_at}${labels ? `, labels ${labels}` : ""}`;
          }),
          ...(r.next_cursor ? [`more: workspace_list with cursor "${r.next_cursor}"`] : []),
        ].join("\n"),
});

/**
 * One page of the listing, most recent activity first (ties by id). The cursor names the
 * last workspace shown (its activity time and id), not an offset: a workspace that comes
 * or goes between pages shifts nothing; one whose activity moved it past the cursor since
 * is shown on no later page (it is on the first).
 */
export function pageWorkspaces<W extends { workspace_id: string; last_activity_at: string }>(
  workspaces: readonly W[],
  cursor: string | undefined,
  limit: number,
): { count: number; workspaces: W[]; next_cursor: string | null } {
  const sorted = [...workspaces].sort((x, y) =>
    x.last_activity_at === y.last_activity_at
      ? x.workspace_id < y.workspace_id
        ? -1
        : 1
      : x.last_activity_at > y.last_activity_at
        ? -1
        : 1,
  );
  let rest = sorted;
  if (cursor !== undefined) {
    const after = decodeListCursor(cursor);
    rest = sorted.filter(
      (w) => w.last_activity_at < after.at || (w.last_activity_at === after.at && w.workspace_id > after.id),
    );
  }
  const page = rest.slice(0, limit);
  const last = page[page.length - 1];
  return {
    count: workspaces.length,
    workspaces: page,
    next_cursor:
      rest.length > limit && last
        ? Buffer.from(JSON.stringify({ at: last.last_activity_at, id: last.workspace_id })).toString(
            "base64url",
          )
        : null,
  };
}

function decodeListCursor(cursor: string): { at: string; id: string } {
  try {
    const v = JSON.parse(Buffer.from(cursor, "base64url").toString("utf8")) as { at?: unknown; id?: unknown };
    if (typeof v.at === "string" && typeof v.id === "string") return { at: v.at, id: v.id };
  } catch {
    // refused below
  }
  throw new PyroError(
    "invalid_argument",
    "cursor is not a next_cursor of workspace_list",
    "call workspace_list without cursor for the first page",
  );
}

export const workspaceStatus = defineTool({
  name: "workspace_status",
  title: "Workspace status",
  description:
    "Show one workspace: state, environment, backend and execution mode, seed, current snapshot, reset count, limits and expiry. A running workspace whose sandbox died is restarted on its kept files. For what happened in it (commands, edits, changes) use workspace_summary.",
  next: [["workspace_summary", "review what happened in it"]],
  input: z.strictObject({ workspace_id: workspaceIdArg }),
  output: workspaceObject,
  annotations: READ_ONLY,
  run: (a, ctx) => ctx.ws.status(a.workspace_id),
  render: renderWorkspace,
});

export const workspaceUpdate = defineTool({
  name: "workspace_update",
  title: "Rename or relabel workspace",
  description:
    "Rename a workspace or change its labels (files and sandbox are untouched). `labels` are merged into the existing ones; `clear_labels` removes keys.",
  input: z.strictObject({
    workspace_id: workspaceIdArg,
    name: z.string().min(1).max(63).optional().describe("New unique name."),
    labels: labelsArg.optional().describe("Labels to set, merged over the existing ones, as {key: value}."),
    clear_labels: z
      .array(labelKeyArg)
      .max(INPUT_LIMITS.labelEntries)
      .optional()
      .describe("Label keys to remove."),
  }),
  output: workspaceObject,
  annotations: mutating({ destructive: false, idempotent: true }),
  run: (a, ctx) =>
    // The core calls merged labels set_labels.
    ctx.ws.update(
      a.workspace_id,
      defined({ name: a.name, set_labels: a.labels, clear_labels: a.clear_labels }),
    ),
  render: renderWorkspace,
});

export const workspaceDelete = defineTool({
  name: "workspace_delete",
  title: "Delete workspace",
  description: (d) =>
    sentences(
      "Delete a workspace for good: its sandbox, files, snapshots and history.",
      ifOffered(d, "workspace_export", "Export what you want to keep first (workspace_export)."),
      ifOffered(d, "workspace_reset", "To start over but keep the workspace, use workspace_reset instead."),
    ),
  input: z.strictObject({ workspace_id: workspaceIdArg }),
  output: z.looseObject({ workspace_id: z.string(), name: z.string().nullable(), deleted: z.boolean() }),
  annotations: mutating({ destructive: true, idempotent: true }),
  long: "deleting the workspace",
  run: (a, ctx) => ctx.ws.delete(a.workspace_id),
  render: (r) => `deleted ${r.workspace_id}${r.name ? ` (${r.name})` : ""}`,
});

export const workspaceStop = defineTool({
  name: "workspace_stop",
  title: "Stop workspace",
  description:
    "Stop a workspace's sandbox: every process in it ends, its files are kept. Other operations fail with workspace_stopped until workspace_start. Use it to free memory while keeping the work.",
  next: [["workspace_start", "continue later"]],
  input: z.strictObject({ workspace_id: workspaceIdArg }),
  output: workspaceObject,
  annotations: mutating({ destructive: false, idempotent: true }),
  run: (a, ctx) => ctx.ws.stop(a.workspace_id),
  render: renderWorkspace,
});

export const workspaceStart = defineTool({
  name: "workspace_start",
  title: "Start workspace",
  description: "Start a stopped workspace again on its kept files (a running one is returned as is).",
  input: z.strictObject({ workspace_id: workspaceIdArg }),
  output: workspaceObject,
  annotations: mutating({ destructive: false, idempotent: true }),
  long: "starting the workspace",
  run: (a, ctx) => ctx.ws.start(a.workspace_id),
  render: renderWorkspace,
});

export const workspaceNetworkBlocks = defineTool({
  name: "workspace_network_blocks",
  title: "Network blocks",
  description:
    "List the destinations the workspace's network policy refused (capability blocks: target host:port, reason, count, first and last time). Read-only: approving one is a human's decision, made with `pyro workspace network approve ID TARGET` outside this conversation; tell the user which target you need and why.",
  input: z.strictObject({ workspace_id: workspaceIdArg }),
  output: z.looseObject({
    workspace_id: z.string(),
    network_policy: z.string(),
    count: z.number().int().min(0),
    blocks: z.array(
      z.looseObject({
        kind: z.string(),
        target: z.string(),
        reason: z.string(),
        count: z.number(),
        first_at: z.string(),
        last_at: z.string(),
      }),
    ),
  }),
  annotations: READ_ONLY,
  run: (a, ctx) => ctx.ws.networkBlocks(a.workspace_id),
  render: (r) =>
    r.count === 0
      ? `no blocked destinations (network ${r.network_policy})`
      : [
          `${r.count} blocked destination(s) (network ${r.network_policy}); a human can approve one with: pyro workspace network approve ${r.workspace_id} TARGET`,
          ...r.blocks.map((b) => `- ${b.target}: ${b.reason} (${b.count}x, last ${b.last_at})`),
        ].join("\n"),
});
