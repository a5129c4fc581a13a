import { readFile } from "node:fs/promises";
import { resolve } from "node:path";
import { ACTIONS, PyroError } from "../errors.js";
import { exportDirect } from "./export-direct.js";
import { pushDirect } from "./push-direct.js";
import { workspaceArchiveBudget } from "./snapshots.js";
import { exportThrough, pushThrough, requireHostPath } from "./transfer.js";
import { sandboxState } from "./workspace-deps.js";
import type { Workspaces } from "./workspaces.js";

/** File operations through the agent; each mutating one becomes a review event. */

export async function listFiles(ws: Workspaces, idOrName: string, path = "/workspace", recursive = false) {
  return ws.withAgent(idOrName, "files", async (agent, w) => {
    const r = await agent.request("file_list", { path, recursive });
    return { workspace_id: w.workspace_id, ...r };
  });
}

export async function readFileFromWorkspace(
  ws: Workspaces,
  idOrName: string,
  path: string,
  options: { max_bytes?: number } = {},
) {
  return ws.withAgent(idOrName, "files", async (agent, w) => {
    const r = await agent.request("file_read", {
      path,
      ...(options.max_bytes !== undefined ? { max_bytes: options.max_bytes } : {}),
    });
    return { workspace_id: w.workspace_id, ...r };
  });
}

export async function writeFileToWorkspace(
  ws: Workspaces,
  idOrName: string,
  path: string,
  content: string | Buffer,
) {
  return ws.withAgent(idOrName, "files", async (agent, w, journal) => {
    const isText = typeof content === "string";
    const r = await agent.request("file_write", {
      path,
      content: isText ? content : content.toString("base64"),
      encoding: isText ? "utf8" : "base64",
    });
    journal((store) =>
      store.recordEvent(w.workspace_id, "file_write", {
        path: r.path,
        size_bytes: r.size_bytes,
        created: r.created,
      }),
    );
    return { workspace_id: w.workspace_id, ...r };
  });
}

export async function applyPatch(ws: Workspaces, idOrName: string, patch: string) {
  if (patch.trim() === "")
    throw new PyroError("invalid_argument", "the patch is empty", "pass a unified diff");
  return ws.withAgent(idOrName, "files", async (agent, w, journal) => {
    const r = await agent.request("patch_apply", { patch });
    journal((store) => store.recordEvent(w.workspace_id, "patch_apply", { files: r.files }));
    return { workspace_id: w.workspace_id, ...r };
  });
}

/** Changes of /workspace relative to the baseline (or a named snapshot). */
export async function diffWorkspace(ws: Workspaces, idOrName: string, options: { snapshot?: string } = {}) {
  return ws.withAgent(idOrName, "files", async (agent, w) => {
    const snapshot = options.snapshot ?? "baseline";
    if (!ws.history.getSnapshot(w.workspace_id, snapshot)) {
      throw new PyroError(
        "not_found",
        `workspace ${w.workspace_id} has no snapshot '${snapshot}'`,
        "list them with {action}",
        { action: ACTIONS.listSnapshots },
      );
    }
    await ws.exposeSnapshot(w, snapshot, agent);
    const r = await agent.request("diff", { base: ws.agentSnapshotPath(w, snapshot) });
    return { workspace_id: w.workspace_id, base_snapshot: snapshot, ...r };
  });
}

/** Copies a file or directory out of /workspace to a host path (safe against tar-slip). */
export async function exportFromWorkspace(
  ws: Workspaces,
  idOrName: string,
  path: string,
  outputPath: string,
  signal?: AbortSignal,
) {
  const output = resolve(outputPath);
  return ws.withAgent(idOrName, "files", async (agent, w, journal) => {
    const maxBytes = workspaceArchiveBudget(ws, w);
    const state = sandboxState(w);
    // The reader's fast path first (export-direct.ts); the agent for everything else.
    const direct = state
      ? await exportDirect(ws.backendOf(w), { spec: ws.sandboxSpec(w), state }, path, output, {
          ...(maxBytes !== undefined ? { max_bytes: maxBytes } : {}),
          ...(signal ? { signal } : {}),
        })
      : null;
    const got = direct ?? (await exportThrough(agent, path, output, signal, maxBytes));
    journal((store) =>
      store.recordEvent(w.workspace_id, "export", {
        path,
        output_path: output,
        artifact_type: got.artifact_type,
        bytes: got.bytes,
        via: direct ? "tar" : "agent",
      }),
    );
    return { workspace_id: w.workspace_id, path, output_path: output, ...got };
  });
}

/** Copies a host file or directory into /workspace (default: its root). */
export async function syncPush(
  ws: Workspaces,
  idOrName: string,
  source: string,
  dest = "/workspace",
  signal?: AbortSignal,
) {
  await requireHostPath(source);
  return ws.withAgent(idOrName, "files", async (agent, w, journal) => {
    const state = sandboxState(w);
    // GNU tar into the workspace without the agent where it can (push-direct.ts).
    const direct = state
      ? await pushDirect(ws.backendOf(w), { spec: ws.sandboxSpec(w), state }, source, dest, signal)
      : null;
    const r = direct ?? (await pushThrough(agent, source, dest, signal));
    journal((store) =>
      store.recordEvent(w.workspace_id, "sync_push", {
        source: resolve(source),
        dest: r.dest,
        files: r.files,
        bytes: r.bytes,
        via: direct ? "tar" : "agent",
      }),
    );
    return { workspace_id: w.workspace_id, source: resolve(source), ...r };
  });
}

/** Reads text for --text-file / --patch-file. */
export async function readHostText(path: string): Promise<string> {
  try {
    return await readFile(path, "utf8");
  } catch {
    throw new PyroError("not_found", `cannot read ${path}`);
  }
}
