import { diffWorkspace } from "./files.js";
import { secretRedactor } from "./secrets.js";
import type { Workspaces } from "./workspaces.js";

const EDIT_KINDS = ["file_write", "patch_apply", "sync_push"] as const;

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
  const commandCount = history.countCommands(w.workspace_id);
  const commands = history.listCommands(w.workspace_id, { limit: recent });
  const edits = history.listEvents(w.workspace_id, { kinds: EDIT_KINDS, limit: recent });
  const exports = history.listEvents(w.workspace_id, { kinds: ["export"], limit: recent });
  // Service events carry already-redacted commands; the kept definitions do not.
  const serviceEvents = history.listEvents(w.workspace_id, {
    kinds: ["service_start", "service_stop"],
    limit: recent,
  });
  const kept = w.spec.services ?? [];
  const redact = kept.length > 0 ? secretRedactor(await ws.secretValues(w)) : (t: string) => t;
  const snapshots = history.listSnapshots(w.workspace_id).filter((s) => s.kind === "named");
  const last = commands.at(-1);

  let changes: {
    available: boolean;
    changed: boolean | null;
    summary: { total: number; added: number; modified: number; deleted: number } | null;
    entries: { path: string; status: "added" | "modified" | "deleted" }[];
    reason?: string;
  };
  if (w.state === "running") {
    try {
      const d = await diffWorkspace(ws, w.workspace_id);
      changes = { available: true, changed: d.changed, summary: d.summary, entries: d.entries };
    } catch (err) {
      changes = {
        available: false,
        changed: null,
        summary: null,
        entries: [],
        reason: (err as Error).message,
      };
    }
  } else {
    changes = {
      available: false,
      changed: null,
      summary: null,
      entries: [],
      reason: `workspace is ${w.state}`,
    };
  }

  return {
    workspace_id: w.workspace_id,
    name: w.name,
    state: w.state,
    environment: w.environment,
    backend: w.backend,
    outcome: {
      command_count: commandCount,
      last_command: last
        ? {
            command: last.command,
            exit_code: last.exit_code,
            timed_out: last.timed_out,
            started_at: last.started_at,
          }
        : null,
      service_count: kept.length,
      running_service_count: w.state === "running" ? kept.length : 0,
      export_count: history.countEvents(w.workspace_id, ["export"]),
      snapshot_count: snapshots.length,
      reset_count: w.reset_count,
    },
    commands: {
      total: commandCount,
      recent: commands.map((c) => ({
        seq: c.seq,
        command: c.command,
        exit_code: c.exit_code,
        timed_out: c.timed_out,
        duration_ms: c.duration_ms,
        started_at: c.started_at,
      })),
    },
    edits: { recent: edits.map((e) => ({ kind: e.kind, at: e.at, ...e.detail })) },
    changes,
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
