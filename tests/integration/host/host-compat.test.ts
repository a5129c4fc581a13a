import { mkdir, readdir, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AGENT_ENTRY } from "../../../src/backends/guest.js";
import { HostBackend } from "../../../src/backends/host/backend.js";
import { pyro as cli } from "../../helpers/cli.js";
import {
  errorOf,
  type Harness,
  hostProcesses,
  hostSkipReason,
  openHarness,
  suiteTitle,
  waitUntil,
  writeTree,
} from "../../helpers/sandbox.js";

/**
 * The host backend gives no isolation: it must be asked for explicitly
 * (allowHostCompat / --allow-host-compat) and every result must say host_compat.
 * The workspace loop itself behaves as on a sandbox.
 */
const skip = hostSkipReason();

describe.skipIf(skip !== "")(suiteTitle("the host-compat backend", skip), () => {
  let h: Harness;
  let id: string;

  beforeAll(async () => {
    h = await openHarness("host", { backend: "host", allowHostCompat: true });
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("is refused with backend_unavailable unless host compat is allowed, creating nothing", async () => {
    expect((await errorOf(h.pyro.createWorkspace({ backend: "host" }))).code).toBe("backend_unavailable");
    expect((await errorOf(h.pyro.run("debian:12", "true", { backend: "host" }))).code).toBe(
      "backend_unavailable",
    );
    const r = cli(["run", "debian:12", "--backend", "host", "--json", "--", "true"], h.cliEnv);
    expect(r.code).toBe(1);
    expect(r.json()).toMatchObject({ error: { code: "backend_unavailable" } });
    expect((await h.pyro.listWorkspaces()).count).toBe(0);
  });

  it("runs a one-shot command when allowed and says host_compat", async () => {
    const r = await h.pyro.run("debian:12", "echo on-the-host", { backend: "host", allowHostCompat: true });
    expect(r).toMatchObject({
      backend: "host",
      execution_mode: "host_compat",
      exit_code: 0,
      stdout: "on-the-host\n",
    });
    const c = cli(
      ["run", "debian:12", "--backend", "host", "--allow-host-compat", "--json", "--", "echo", "cli"],
      h.cliEnv,
    );
    expect(c.code, c.stderr).toBe(0);
    expect(c.json()).toMatchObject({ execution_mode: "host_compat", stdout: "cli\n" });
    expect((await h.pyro.listWorkspaces()).count).toBe(0);
  });

  it("creates a workspace whose every result says host_compat", async () => {
    const seed = join(await h.tempDir("host-seed"), "seed");
    await writeTree(seed, { "app.txt": "seeded\n" });
    const w = await h.create({ seedPath: seed });
    id = w.workspace_id;
    expect(w).toMatchObject({
      backend: "host",
      execution_mode: "host_compat",
      state: "running",
      workspace_seed: { kind: "directory", file_count: 1 },
    });
    expect(await h.pyro.execWorkspace(id, "cat app.txt; echo err >&2; exit 4")).toMatchObject({
      exit_code: 4,
      stdout: "seeded\n",
      stderr: "err\n",
      execution_mode: "host_compat",
    });
    expect((await h.pyro.getWorkspace(id)).execution_mode).toBe("host_compat");
    expect((await h.pyro.workspaceLogs(id)).commands[0]).toMatchObject({
      exit_code: 4,
      execution_mode: "host_compat",
    });
  });

  it("edits through the file tools with /workspace paths, refuses paths that leave it, diffs and resets", async () => {
    await h.pyro.writeWorkspaceFile(id, "/workspace/notes/new.md", "# new\n");
    expect((await h.pyro.readWorkspaceFile(id, "notes/new.md")).content).toBe("# new\n");
    expect((await errorOf(h.pyro.writeWorkspaceFile(id, "../escape.txt", "x"))).code).toBe(
      "path_outside_workspace",
    );
    expect((await errorOf(h.pyro.readWorkspaceFile(id, "/etc/passwd"))).code).toBe("path_outside_workspace");
    await h.pyro.execWorkspace(id, "rm app.txt");
    expect((await h.pyro.diffWorkspace(id)).entries).toEqual([
      { path: "app.txt", status: "deleted" },
      { path: "notes/new.md", status: "added" },
    ]);
    const reset = await h.pyro.resetWorkspace(id);
    expect(reset).toMatchObject({ reset_count: 1, execution_mode: "host_compat" });
    expect((await h.pyro.execWorkspace(id, "ls -A")).stdout).toBe("app.txt\n");
    expect((await h.pyro.diffWorkspace(id)).changed).toBe(false);
  });

  it("a start that fails leaves no agent running", async () => {
    // An agent that never answers (a package whose agent only sleeps), and a start
    // cancelled while it waits: the backend must end what it spawned.
    const base = await h.tempDir("host-silent");
    await mkdir(dirname(join(base, "app", AGENT_ENTRY)), { recursive: true });
    await writeFile(join(base, "app", AGENT_ENTRY), "setInterval(() => {}, 1000);\n");
    await mkdir(join(base, "snapshots", "baseline"), { recursive: true });
    const spec = {
      workspace_id: "ws_000000000001",
      dir: join(base, "ws"),
      rootfs: "/",
      snapshotsDir: join(base, "snapshots"),
      snapshot: "baseline",
      limits: { vcpus: 1, memory_mib: 256, pids_max: 64 },
      appDir: join(base, "app"),
      runtimeCacheDir: join(base, "runtime"),
    };
    const silent = () => hostProcesses((argv) => argv.some((a) => a.startsWith(join(base, "app"))));
    const ac = new AbortController();
    const started = new HostBackend().start(spec, { signal: ac.signal });
    expect(await waitUntil(() => silent().length > 0, 10_000)).toBe(true);
    ac.abort();
    await expect(started).rejects.toBeDefined();
    expect(await waitUntil(() => silent().length === 0, 10_000)).toBe(true);
  });

  it("deletes the workspace with its directory", async () => {
    expect(await h.pyro.deleteWorkspace(id)).toMatchObject({ workspace_id: id, deleted: true });
    expect((await errorOf(h.pyro.execWorkspace(id, "true"))).code).toBe("workspace_not_found");
    expect(await readdir(join(h.home, "workspaces"))).toEqual([]);
  });
});
