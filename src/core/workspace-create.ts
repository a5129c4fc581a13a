import { randomBytes } from "node:crypto";
import { join } from "node:path";
import type { SandboxState, WorkspaceBackend } from "../backends/backend.js";
import { PyroError } from "../errors.js";
import type { NetworkPolicy, PublishedPort, WorkspaceRow, WorkspaceSeed } from "../state/types.js";
import { removeTree } from "../util/mounts.js";
import { checkNetworkSupport, checkPublishedPorts, parseNetworkPolicy } from "./network.js";
import { currentOwner, makeWorkspaceDir } from "./recovery.js";
import { secretKeyPaths } from "./secret-key.js";
import { resolveSecrets } from "./secrets.js";
import { seedInto } from "./seed.js";
import { workspaceView } from "./views.js";
import { label, type WorkspaceInternals } from "./workspace-deps.js";
import {
  type CreateOptions,
  checkDiskMib,
  checkLimits,
  createSpec,
  DEFAULTS,
  resolveDisk,
  validateName,
} from "./workspace-spec.js";

/**
 * Creates a workspace: checks, secrets, the environment, the seed, its row and baseline,
 * its network helper and its sandbox. Anything failing on the way undoes what was made.
 */
export async function createWorkspace(inner: WorkspaceInternals, options: CreateOptions) {
  const { deps, ws } = inner;
  const pullOptions = {
    ...(options.signal ? { signal: options.signal } : {}),
    ...(options.on_progress ? { onProgress: options.on_progress } : {}),
  };
  // No environment named: the seed repository's recipe, when it has one.
  const recipeEnv =
    options.environment === undefined && options.seed_path && deps.seedRecipe
      ? await deps.seedRecipe(options.seed_path, pullOptions)
      : null;
  const environment = options.environment ?? recipeEnv ?? "debian:12";
  const backend = await deps.chooseBackend(options.backend, options.allow_host_compat === true);
  const { policy, ports } = checkCreate(inner, options, backend);
  const disk = await resolveDisk(options.disk_mib, backend);
  // Secrets first: a missing host variable or terminal fails before anything is made.
  const secrets = await resolveSecrets(options.secrets ?? {}, deps.env, options.prompt_secret);
  const env = await deps.environments.pull(environment, pullOptions);
  const id = `ws_${randomBytes(6).toString("hex")}`;
  const dir = ws.workspaceDir(id);
  const baseline = join(dir, "snapshots", "baseline");
  // Until the create is recorded as done, another client can tell whether this process
  // still works on it (recovery.ts rolls back creates whose process died).
  await makeWorkspaceDir(dir);
  let created: WorkspaceRow | null = null;
  try {
    const seed = await seedInto(
      baseline,
      options,
      options.signal,
      [deps.paths.home, deps.paths.environmentsDir, ...secretKeyPaths(deps.env)],
      join(deps.paths.home, "repos", id),
    );
    created = inner.deps.store().createWorkspace({
      workspace_id: id,
      name: options.name ?? null,
      labels: options.labels ?? {},
      environment,
      backend: backend.name,
      state: "creating",
      network_policy: policy,
      ttl_seconds: options.ttl_seconds === undefined ? DEFAULTS.ttl_seconds : options.ttl_seconds,
      workspace_seed: seed,
      spec: createSpec(options, disk, ports, env.image_env),
      runtime: { rootfs: env.rootfs, env_key: env.recipe_key, owner: await currentOwner() },
      current_snapshot: "baseline",
      secret_refs: secrets.refs,
    });
    inner.secrets.save(id, secrets.values);
    inner.deps.store().upsertSnapshot({
      workspace_id: id,
      name: "baseline",
      kind: "baseline",
      layer: baseline,
      bytes: seed.bytes,
      file_count: seed.file_count,
    });
    const started = await startFirst(inner, created, backend, options.signal);
    created = started.row;
    const { state, spare } = started;
    const w = inner.setState(id, "running", { runtime: { sandbox: state, owner: null } });
    recordCreated(inner, w, environment, backend, seed, spare !== null);
    return workspaceView(w, backend.executionMode);
  } catch (err) {
    await rollbackCreate(inner, id, created, backend);
    throw err;
  }
}

/**
 * The new workspace's first sandbox (a spare of the pool when one fits) and its network
 * helper, started side by side: neither needs the other until the helper attaches to the
 * sandbox (core/netd-attach.ts); only the directory the sandbox binds must exist first.
 * A failure leaves nothing running but what the caller's rollback removes.
 */
async function startFirst(
  inner: WorkspaceInternals,
  created: WorkspaceRow,
  backend: WorkspaceBackend,
  signal: AbortSignal | undefined,
): Promise<{ row: WorkspaceRow; state: SandboxState; spare: SandboxState | null }> {
  const { ws, deps } = inner;
  await ws.net.prepare(created.workspace_id);
  const spec = ws.sandboxSpec(created);
  // Before the helper starts: a hand-out moves the net directory's entries (bwrap/pool.ts).
  const spare = (await deps.pool?.take(backend, spec)) ?? null;
  const network = inner.startNetwork(created, backend);
  network.catch(() => {});
  let state: SandboxState;
  try {
    state = spare ?? (await backend.start(spec, signal ? { signal } : {}));
  } catch (err) {
    // The rollback stops the helper: it must have written its report first.
    await network.catch(() => {});
    throw err;
  }
  let row: WorkspaceRow;
  try {
    row = await network;
  } catch (err) {
    await backend.stop(state).catch(() => {});
    throw err;
  }
  await ws.net.attach(row, backend, state);
  return { row, state, spare };
}

/** The create's event in the workspace's history, and the engine event hosts see. */
function recordCreated(
  inner: WorkspaceInternals,
  w: WorkspaceRow,
  environment: string,
  backend: WorkspaceBackend,
  seed: WorkspaceSeed,
  pooled: boolean,
): void {
  const id = w.workspace_id;
  inner.deps.store().recordEvent(id, "create", {
    environment,
    backend: backend.name,
    seed: seed.kind,
    source: seed.source,
    sandbox: pooled ? "pool" : "started",
  });
  inner.ws.emit({
    level: "notice",
    kind: "workspace",
    message: `workspace ${label(w)} created: ${environment} on ${backend.name}, sandbox started`,
    workspace_id: id,
    workspaces_changed: true,
    data: { environment, backend: backend.name },
  });
}

/** What a create is refused for before anything is made: limits, seed, policy, name. */
function checkCreate(
  inner: WorkspaceInternals,
  options: CreateOptions,
  backend: WorkspaceBackend,
): { policy: NetworkPolicy; ports: PublishedPort[] } {
  checkDiskMib(options.disk_mib, backend.diskLimitSupport ? undefined : backend.name);
  checkLimits(options);
  if (options.repo_ref !== undefined && !options.repo_url)
    throw new PyroError(
      "invalid_argument",
      "a repository ref needs a repository URL",
      "give the repository with {action}, or drop the ref",
      { action: { cli: "--repo-url", tool: "repo_url" } },
    );
  const policy = parseNetworkPolicy(options.network_policy);
  const ports = checkPublishedPorts(options.published_ports);
  checkNetworkSupport(backend, policy, ports);
  if (options.name !== undefined) validateName(options.name);
  if (options.name && inner.deps.store().nameTaken(options.name)) {
    throw new PyroError(
      "conflict",
      `a workspace named '${options.name}' already exists`,
      "pick another name or delete the old one",
    );
  }
  return { policy, ports };
}

/** Undoes a create that failed: its row, its sandbox and its directory (best effort). */
async function rollbackCreate(
  inner: WorkspaceInternals,
  id: string,
  created: WorkspaceRow | null,
  backend: WorkspaceBackend,
): Promise<void> {
  const { ws } = inner;
  await ws.net.stop(id).catch(() => {});
  if (created) inner.deps.store().deleteWorkspace(id);
  const row =
    created ?? ({ workspace_id: id, spec: { vcpus: 1, memory_mib: 1 }, runtime: {} } as WorkspaceRow);
  await backend.destroy(ws.sandboxSpec(row), null).catch(() => {});
  await removeTree(ws.workspaceDir(id)).catch(() => {});
}
