import { join, resolve } from "node:path";
import { AgentClient } from "../agent/client.js";
import { closeReader, readerStderr } from "../backends/disk-reader.js";
import { PyroError, toPyroError } from "../errors.js";
import type { WorkspaceRow } from "../state/types.js";
import { acquireLock } from "../util/lock.js";
import { secretRedactor } from "./secrets.js";
import { workspaceArchiveBudget } from "./snapshots.js";
import { exportThrough } from "./transfer.js";
import { sandboxState } from "./workspace-deps.js";
import type { Workspaces } from "./workspaces.js";

/**
 * The disk tools: a STOPPED workspace's /workspace (its snapshot under its writable
 * layer) read without starting it. The backend opens a read-only agent on a read-only
 * view of the files (WorkspaceBackend.openDisk); the same ops as the running file tools
 * (file_list, file_read, tar_out) run on it, so path rules, error codes and result
 * shapes are the file tools' own. Nothing of the workspace changes: no state, no
 * activity time, no event. The start lock is held meanwhile, so a start or reset waits.
 */

/** Handshake bound: a VM state disk is copied and checked before the reader answers. */
const READER_HANDSHAKE_MS = 30_000;

async function withDisk<T>(
  ws: Workspaces,
  idOrName: string,
  fn: (agent: AgentClient, w: WorkspaceRow) => Promise<T>,
  signal?: AbortSignal,
): Promise<T> {
  const found = await ws.get(idOrName);
  assertStopped(found);
  const backend = ws.backendOf(found);
  if (!backend.openDisk)
    throw new PyroError(
      "unsupported",
      `the ${found.backend} backend cannot read a stopped workspace's disk`,
      "start the workspace and use the file tools",
    );
  const release = await acquireLock(join(ws.workspaceDir(found.workspace_id), "start.lock"), {
    timeoutMs: 60_000,
    ...(signal ? { signal } : {}),
  });
  try {
    // Under the lock: a start that won the race has made it running.
    const w = ws.stored(found.workspace_id);
    if (!w) throw new PyroError("workspace_not_found", `workspace ${found.workspace_id} was deleted`);
    assertStopped(w);
    if (sandboxState(w)) throw new PyroError("conflict", `workspace ${w.workspace_id} still has a sandbox`);
    const secrets = await ws.secretValues(w);
    const stream = await backend.openDisk(ws.sandboxSpec(w), signal ? { signal } : {});
    try {
      let agent: AgentClient;
      try {
        agent = await AgentClient.connect(stream, {
          timeoutMs: READER_HANDSHAKE_MS,
          ...(signal ? { signal } : {}),
        });
      } catch (err) {
        const why = readerStderr(stream);
        throw why
          ? new PyroError(
              "backend_unavailable",
              `the disk reader did not start: ${why.split("\n").slice(-3).join(" | ")}`,
            )
          : err;
      }
      try {
        return await fn(agent, w);
      } finally {
        agent.close();
      }
    } catch (err) {
      const e = toPyroError(err);
      throw secrets.size > 0 ? e.withTexts(secretRedactor(secrets)) : e;
    } finally {
      await closeReader(stream);
    }
  } finally {
    await release();
  }
}

/** Only a stopped workspace has a disk to read; anything else is a `conflict`. */
function assertStopped(w: WorkspaceRow): void {
  if (w.state === "stopped") return;
  throw new PyroError(
    "conflict",
    `workspace ${w.workspace_id} is ${w.state}; the disk tools read only a stopped workspace`,
    w.state === "running"
      ? "stop it first with {action}, or use the file tools on the running workspace"
      : "wait until it is stopped",
    w.state === "running"
      ? { action: { cli: `pyro workspace stop ${w.workspace_id}`, tool: "workspace_stop" } }
      : undefined,
  );
}

/** `file list` of a stopped workspace: entries[] {path, artifact_type, size_bytes, link_target}. */
export async function listDisk(
  ws: Workspaces,
  idOrName: string,
  path = "/workspace",
  recursive = false,
  signal?: AbortSignal,
) {
  return withDisk(
    ws,
    idOrName,
    async (agent, w) => {
      const r = await agent.request("file_list", { path, recursive });
      return { workspace_id: w.workspace_id, ...r };
    },
    signal,
  );
}

/** `file read` of a stopped workspace: content, encoding, size_bytes, truncated. */
export async function readDisk(
  ws: Workspaces,
  idOrName: string,
  path: string,
  options: { max_bytes?: number; signal?: AbortSignal } = {},
) {
  return withDisk(
    ws,
    idOrName,
    async (agent, w) => {
      const r = await agent.request("file_read", {
        path,
        ...(options.max_bytes !== undefined ? { max_bytes: options.max_bytes } : {}),
      });
      return { workspace_id: w.workspace_id, ...r };
    },
    options.signal,
  );
}

/** `export` of a stopped workspace: a file or directory copied to a host path, all or nothing. */
export async function exportDisk(
  ws: Workspaces,
  idOrName: string,
  path: string,
  outputPath: string,
  signal?: AbortSignal,
) {
  const output = resolve(outputPath);
  return withDisk(
    ws,
    idOrName,
    async (agent, w) => ({
      workspace_id: w.workspace_id,
      path,
      output_path: output,
      ...(await exportThrough(agent, path, output, signal, workspaceArchiveBudget(ws, w))),
    }),
    signal,
  );
}
