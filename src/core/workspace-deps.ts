import type { AgentClient } from "../agent/client.js";
import type { BackendName, SandboxSpec, SandboxState, WorkspaceBackend } from "../backends/backend.js";
import type { EnvironmentCache, PullOptions } from "../env/cache.js";
import type { StateStore } from "../state/store.js";
import type { WorkspacePatch, WorkspaceRow, WorkspaceState } from "../state/types.js";
import type { PyroPaths } from "./config.js";
import type { EngineEvents } from "./events.js";
import type { SandboxPool } from "./pool.js";
import type { WorkspaceSecrets } from "./secrets.js";
import type { Workspaces } from "./workspaces.js";

/** What an operation may write to the journal. */
export type JournalWriter = Pick<
  StateStore,
  "recordCommand" | "recordEvent" | "updateWorkspace" | "getWorkspace" | "upsertSnapshot" | "deleteSnapshot"
>;

/**
 * What an operation may read of the journal: its history (commands, their output, review
 * events) and its snapshots. Feature modules read through this and write through
 * `journal`; the store itself stays inside Workspaces.
 */
export type JournalReader = Pick<
  StateStore,
  | "listCommands"
  | "getCommand"
  | "countCommands"
  | "commandOutputSizes"
  | "commandOutput"
  | "listEvents"
  | "countEvents"
  | "getSnapshot"
  | "listSnapshots"
>;

/**
 * What Workspaces needs from the engine, and nothing more: the store, the backends (one
 * by name, or the default choice), the environment cache, the paths, the environment
 * and where the pyro package is. The Engine provides it; tests may provide less.
 */
export interface WorkspaceDeps {
  store(): StateStore;
  backend(name: BackendName): WorkspaceBackend;
  chooseBackend(requested: BackendName | undefined, allowHostCompat: boolean): Promise<WorkspaceBackend>;
  readonly environments: Pick<EnvironmentCache, "pull">;
  readonly paths: Pick<PyroPaths, "home" | "environmentsDir">;
  readonly env: NodeJS.ProcessEnv;
  readonly appDir: string;
  /** Test-only destination overrides for the egress proxy (EngineOptions.networkTestHosts). */
  readonly networkTestHosts?: Record<string, string> | undefined;
  /** The environment a seed's `.pyro/environment.toml` builds, or null without one (core/recipes.ts). */
  seedRecipe?(seedPath: string, options: PullOptions): Promise<string | null>;
  /** Where lifecycle events go (sandbox starts and restarts, workspaces created and removed). */
  readonly events?: EngineEvents;
  /** Started sandboxes for new workspaces (core/pool.ts); none in tests that give none. */
  readonly pool?: Pick<SandboxPool, "take" | "want">;
}

/**
 * What the modules Workspaces is split into (workspace-create.ts, workspace-agent.ts,
 * workspace-removal.ts, workspace-update.ts, workspace-starts.ts) share of it: its public
 * face plus the state and steps it keeps private. Workspaces builds one and hands it only
 * to them, so feature modules still see the journal and never the store.
 */
export interface WorkspaceInternals {
  readonly ws: Workspaces;
  readonly deps: WorkspaceDeps;
  readonly secrets: WorkspaceSecrets;
  /** The one place a workspace's state is written: the lifecycle checks the change. */
  setState(id: string, to: WorkspaceState, patch?: Omit<WorkspacePatch, "state">): WorkspaceRow;
  /** Starts (or stops) the workspace's network helper to match its row. */
  startNetwork(w: WorkspaceRow, backend: WorkspaceBackend): Promise<WorkspaceRow>;
  /** Starts a workspace's sandbox and records it running (or `error`). */
  startSandbox(w: WorkspaceRow, spec: SandboxSpec): Promise<WorkspaceRow>;
  /** The cached agent connection of `w`, or a new one. */
  client(w: WorkspaceRow, backend: WorkspaceBackend): Promise<AgentClient>;
  /** Closes and forgets workspace `id`'s agent connection. */
  dropClient(id: string): Promise<void>;
  /** Whether an open agent connection proves `w`'s recorded sandbox runs (connections.ts `live`). */
  liveClient(w: WorkspaceRow): boolean;
}

/** A workspace's recorded sandbox (null when none runs). */
export function sandboxState(w: WorkspaceRow): SandboxState | null {
  const s = w.runtime.sandbox;
  return s && typeof s === "object" ? (s as SandboxState) : null;
}

/** How events name a workspace: its id, and its name when it has one. */
export function label(w: { workspace_id: string; name: string | null }): string {
  return w.name ? `${w.workspace_id} (${w.name})` : w.workspace_id;
}
