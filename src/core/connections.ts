import type { AgentClient } from "../agent/client.js";
import type { SandboxState, WorkspaceBackend } from "../backends/backend.js";
import { PyroError } from "../errors.js";

/**
 * The agent connections of one Workspaces instance, at most one per workspace. Cached per
 * instance, so an SDK user or the MCP server gets warm round trips while a CLI call makes
 * one connection; a connection that fails to open is forgotten at once.
 */
/** A cached connection: the client, the sandbox it was opened to (its state, as JSON), and the client once open. */
interface Cached {
  client: Promise<AgentClient>;
  sandbox: string;
  open?: AgentClient;
}

export class AgentConnections {
  private readonly clients = new Map<string, Cached>();

  /** The cached connection to workspace `id`'s agent, or a new one through `backend.connect()`. */
  get(id: string, state: SandboxState | null, backend: WorkspaceBackend): Promise<AgentClient> {
    const cached = this.clients.get(id);
    if (cached) return cached.client;
    if (!state)
      return Promise.reject(new PyroError("workspace_stopped", `workspace ${id} has no running sandbox`));
    const client = backend
      .connect(state, { timeoutMs: 5000 })
      .then(async (stream) => (await agentClient()).connect(stream, { timeoutMs: 10_000 }));
    const entry: Cached = { client, sandbox: JSON.stringify(state) };
    this.clients.set(id, entry);
    client.then(
      (c) => {
        entry.open = c;
      },
      () => {
        // Only this entry: a connection that fails after a drop must not take a newer one
        // with it (that one would stay open, unknown to closeAll, and keep the process up).
        if (this.clients.get(id) === entry) this.clients.delete(id);
      },
    );
    return client;
  }

  /**
   * Whether this instance holds an open connection to the agent of exactly this sandbox:
   * then the sandbox runs (its agent answered on it, and the sandbox's end closes with it),
   * and a use need not ask the backend again (a /proc read per exec on bwrap). A sandbox
   * that died since is found by the request itself, whose broken connection is handled
   * as before (workspace-agent.ts).
   */
  live(id: string, state: SandboxState | null): boolean {
    const entry = this.clients.get(id);
    return (
      entry?.open !== undefined &&
      !entry.open.closed &&
      state !== null &&
      entry.sandbox === JSON.stringify(state)
    );
  }

  /** Closes and forgets workspace `id`'s connection, if it has one. */
  async drop(id: string): Promise<void> {
    const entry = this.clients.get(id);
    this.clients.delete(id);
    if (entry) await entry.client.then((c) => c.close()).catch(() => {});
  }

  /** Closes every connection (the sandboxes keep running). */
  async closeAll(): Promise<void> {
    await Promise.all([...this.clients.keys()].map((id) => this.drop(id)));
  }
}

/** How long a broken connection's sandbox is given to finish dying before it counts as alive. */
const BREAK_SETTLE_MS = 2000;

/**
 * Whether the sandbox still runs after its agent connection broke mid-request. A killed
 * sandbox closes its sockets before the kernel marks it dead (files are closed before the
 * exit is reported), so the first look can still see it running: look again until it is
 * gone or BREAK_SETTLE_MS have passed.
 */
export async function stillRunningAfterBreak(
  backend: WorkspaceBackend,
  state: SandboxState,
): Promise<boolean> {
  const deadline = Date.now() + BREAK_SETTLE_MS;
  for (;;) {
    if (!(await backend.isRunning(state).catch(() => false))) return false;
    if (Date.now() >= deadline) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
}

/**
 * The agent client's module, imported on the first connection: its protocol schemas
 * take ~30 ms to build, which a process that connects to no agent (a `pyro run`, a
 * `pyro workspace list`) does not pay.
 */
export async function agentClient(): Promise<typeof AgentClient> {
  return (await import("../agent/client.js")).AgentClient;
}
