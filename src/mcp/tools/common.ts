import type { BackendName } from "../../core/vocabulary.js";
import { DEFAULT_ENVIRONMENT } from "../../core/vocabulary.js";
import type { ToolContext } from "../tool.js";

/**
 * Makes sure the environment is cached before a create or run, reporting build steps as
 * MCP progress. The core's create/run pull the environment themselves but take no
 * progress callback; pulling here first (the second pull is a cache hit) is what lets a
 * client see a cold build advance. The backend is chosen first so that a host where
 * nothing can run fails at once instead of after a long build.
 */
export async function ensureEnvironment(
  ctx: ToolContext,
  environment: string | undefined,
  backend: BackendName | undefined,
): Promise<void> {
  const engine = ctx.engine;
  await engine.chooseBackend(backend, ctx.allowHostCompat);
  await engine.environments.pull(environment ?? DEFAULT_ENVIRONMENT, {
    onProgress: (p) => ctx.progress.build(p),
    signal: ctx.signal,
  });
}

/** Omits undefined members, so optional arguments are passed on only when given. */
export function defined<T extends Record<string, unknown>>(
  o: T,
): { [K in keyof T]?: Exclude<T[K], undefined> } {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as {
    [K in keyof T]?: Exclude<T[K], undefined>;
  };
}

interface CommandOutput {
  exit_code: number;
  stdout: string;
  stderr: string;
  duration_ms: number;
  timed_out: boolean;
  truncated: boolean;
  execution_mode: string;
}

/**
 * The text of an exec or run: a status line, then the streams as they are (already cut
 * to the call's max_output_bytes). `note` says where a truncated output's rest is.
 */
export function renderCommand(r: CommandOutput, where: string, note?: string): string {
  const status = r.timed_out
    ? `timed out after ${r.duration_ms} ms (killed)`
    : `exit ${r.exit_code} in ${r.duration_ms} ms`;
  const lines = [`${status}${where ? ` (${where})` : ""}`];
  if (r.execution_mode === "host_compat")
    lines.push("warning: ran on the host without isolation (host_compat)");
  if (r.truncated && note) lines.push(note);
  if (r.stdout) lines.push("--- stdout ---", r.stdout.replace(/\n$/, ""));
  if (r.stderr) lines.push("--- stderr ---", r.stderr.replace(/\n$/, ""));
  if (!r.stdout && !r.stderr) lines.push("(no output)");
  return lines.join("\n");
}

interface WorkspaceLike {
  workspace_id: string;
  name: string | null;
  state: string;
  environment: string;
  backend: string;
  execution_mode: string;
  network_policy: string;
  workspace_seed: { kind: string; source: string | null; file_count: number; commit?: string };
  labels: Record<string, string>;
  reset_count: number;
  current_snapshot: string | null;
  expires_at: string | null;
}

/** The text of a workspace view (create, status, update, stop, start, reset). */
export function renderWorkspace(w: WorkspaceLike): string {
  const seed = w.workspace_seed;
  const labels = Object.entries(w.labels)
    .map(([k, v]) => `${k}=${v}`)
    .join(", ");
  const lines = [
    `workspace ${w.workspace_id}${w.name ? ` (${w.name})` : ""}: ${w.state}`,
    `environment ${w.environment}, backend ${w.backend} (${w.execution_mode}), network ${w.network_policy}`,
    `seed: ${seed.kind}${seed.source ? ` ${seed.source}` : ""}${seed.commit ? ` @ ${seed.commit.slice(0, 12)}` : ""} (${seed.file_count} files)`,
    `on snapshot ${w.current_snapshot ?? "baseline"}, resets ${w.reset_count}, expires ${w.expires_at ?? "never"}${labels ? `, labels ${labels}` : ""}`,
  ];
  if (w.execution_mode === "host_compat")
    lines.push("warning: this workspace runs on the host without isolation (host_compat)");
  return lines.join("\n");
}
