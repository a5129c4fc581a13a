import type { CommandRow, EventKind, WorkspaceRow } from "../state/types.js";
import { diffWorkspace } from "./files.js";
import { secretRedactor } from "./secrets.js";
import type { JournalReader } from "./workspace-deps.js";
import type { Workspaces } from "./workspaces.js";

const EDIT_KINDS = ["file_write", "patch_apply", "sync_push"] as const;

/** The summary's `changes`: the live diff against the baseline, or why there is none. */
export interface ChangesSection {
  available: boolean;
  changed: boolean | null;
  summary: { total: number; added: number; modified: number; deleted: number } | null;
  entries: { path: string; status: "added" | "modified" | "deleted" }[];
  reason?: string;
}

/**
 * One review of a workspace: what ran, what was edited, what changed against the
 * baseline, what was exported and snapshotted. Built from the review events, the command
 * history and a live diff (when the workspace is running).
 */
export async function summarizeWorkspace(
  ws: Workspaces,
  idOrName: string,
  options: { recent?: number } = {},
) {
  const w = await ws.get(idOrName);
  const recent = options.recent ?? 10;
  const history = ws.history;
  const id = w.workspace_id;
  const commandCount = history.countCommands(id);
  const commands = history.listCommands(id, { limit: recent });
  const recentEvents = (kinds: readonly EventKind[]) => history.listEvents(id, { kinds, limit: recent });
  const edits = recentEvents(EDIT_KINDS);
  const exports = recentEvents(["export"]);
  const serviceEvents = recentEvents(["service_start", "service_stop"]);
  const kept = w.spec.services ?? [];
  // Service events carry already-redacted commands; the kept definitions do not.
  const redact = kept.length > 0 ? secretRedactor(await ws.secretValues(w)) : (t: string) => t;
  const snapshots = history.listSnapshots(id).filter((s) => s.kind === "named");
  return {
    workspace_id: id,
    name: w.name,
    state: w.state,
    environment: w.environment,
    backend: w.backend,
    outcome: outcome(w, history, commandCount, commands.at(-1), snapshots.length),
    commands: { total: commandCount, recent: commands.map(commandView) },
    edits: { recent: edits.map((e) => ({ kind: e.kind, at: e.at, ...e.detail })) },
    changes: await changesSection(ws, w),
    services: {
      current: kept.map((d) => ({ name: d.name, command: redact(d.command) })),
      recent: serviceEvents.map((e) => ({ kind: e.kind, at: e.at, ...e.detail })),
    },
    artifacts: { exports: exports.map((e) => ({ at: e.at, ...e.detail })) },
    snapshots: {
      named_count: snapshots.length,
      recent: snapshots
        .slice(-recent)
        .map((s) => ({ snapshot_name: s.name, created_at: s.created_at, size_bytes: s.bytes })),
    },
  };
}

/** The summary's `outcome`: counts, and the last command run. */
function outcome(
  w: WorkspaceRow,
  history: JournalReader,
  commandCount: number,
  last: CommandRow | undefined,
  snapshotCount: number,
) {
  const services = (w.spec.services ?? []).length;
  return {
    command_count: commandCount,
    last_command: last
      ? {
          command: last.command,
          exit_code: last.exit_code,
          timed_out: last.timed_out,
          started_at: last.started_at,
        }
      : null,
    service_count: services,
    running_service_count: w.state === "running" ? services : 0,
    export_count: history.countEvents(w.workspace_id, ["export"]),
    snapshot_count: snapshotCount,
    reset_count: w.reset_count,
  };
}

/** One command of the summary's recent commands. */
function commandView(c: CommandRow) {
  return {
    seq: c.seq,
    command: c.command,
    exit_code: c.exit_code,
    timed_out: c.timed_out,
    duration_ms: c.duration_ms,
    started_at: c.started_at,
  };
}

/** The live diff of a running workspace; a stopped one, or a failed diff, says why there is none. */
async function changesSection(ws: Workspaces, w: WorkspaceRow): Promise<ChangesSection> {
  const none = { available: false, changed: null, summary: null, entries: [] };
  if (w.state !== "running") return { ...none, reason: `workspace is ${w.state}` };
  try {
    const d = await diffWorkspace(ws, w.workspace_id);
    return { available: true, changed: d.changed, summary: d.summary, entries: d.entries };
  } catch (err) {
    return { ...none, reason: (err as Error).message };
  }
}
