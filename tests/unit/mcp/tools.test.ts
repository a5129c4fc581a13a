import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { entryDirName, recipeKey } from "../../../src/env/catalog.js";
import { checkRecipe, recipeSource } from "../../../src/env/recipe.js";
import { MODE_NAMES, PROFILE_NAMES, TOOL_NAMES, type ToolName, toolSet } from "../../../src/mcp/profiles.js";
import type { ToolDefinition } from "../../../src/mcp/tool.js";
import { toolDefinitions } from "../../../src/mcp/tools/index.js";
import { makeGitRepo } from "../../helpers/git.js";
import { FIX, type McpFixture, mcpFixture, PROJECT } from "./helpers.js";
import { PINNED } from "./pinned.js";

/**
 * Every tool of every profile and mode, through a real MCP client on the in-memory
 * transport: the listing (names, schemas, annotations), a happy-path call whose
 * structuredContent matches the output schema (the client also validates it against the
 * advertised JSON Schema), malformed arguments, and an unknown workspace.
 */

const READ_ONLY: ToolName[] = [
  "workspace_list",
  "workspace_status",
  "workspace_logs",
  "workspace_summary",
  "workspace_file_list",
  "workspace_file_read",
  "workspace_diff",
  "snapshot_list",
  "workspace_network_blocks",
  "service_list",
  "service_status",
  "service_logs",
  "workspace_disk_list",
  "workspace_disk_read",
  "shell_read",
];
const DESTRUCTIVE: ToolName[] = [
  "workspace_disk_export",
  "workspace_exec",
  "workspace_file_write",
  "workspace_patch_apply",
  "workspace_sync_push",
  "workspace_export",
  "workspace_reset",
  "workspace_delete",
  "snapshot_delete",
  "service_stop",
  "shell_write",
  "shell_signal",
  "shell_close",
];
const IDEMPOTENT: ToolName[] = [
  "environment_build",
  "workspace_disk_export",
  "workspace_update",
  "workspace_file_write",
  "workspace_sync_push",
  "workspace_export",
  "workspace_reset",
  "workspace_delete",
  "snapshot_delete",
  "workspace_stop",
  "workspace_start",
  "service_stop",
];
const WITHOUT_WORKSPACE: ToolName[] = ["vm_run", "workspace_create", "workspace_list", "environment_build"];

let serial = 0;
const uniqueName = () => `w${++serial}-${process.pid}`;

/** A seeded workspace made through the SDK, so a tool's test does not depend on other tools. */
const seeded = (fx: McpFixture) => fx.pyro.createWorkspace({ seedPath: fx.project });

/** One happy-path call per tool, with checks of what it did. Returns the structuredContent. */
const HAPPY: Record<ToolName, (fx: McpFixture) => Promise<any>> = {
  vm_run: async (fx) => {
    const before = (await fx.pyro.listWorkspaces()).count;
    const r = await fx.ok("vm_run", { command: "echo hi; echo err >&2; exit 3" });
    expect(r).toMatchObject({
      exit_code: 3,
      stdout: "hi\n",
      stderr: "err\n",
      timed_out: false,
      execution_mode: "guest_agent",
    });
    // The sandbox was thrown away.
    expect((await fx.pyro.listWorkspaces()).count).toBe(before);
    return r;
  },
  workspace_create: async (fx) => {
    const name = uniqueName();
    const r = await fx.ok("workspace_create", { name, labels: { task: "t1" } });
    expect(r).toMatchObject({
      name,
      labels: { task: "t1" },
      state: "running",
      environment: "debian:12",
      network_policy: "off",
    });
    expect(r.workspace_seed).toMatchObject({
      kind: "directory",
      source: fx.project,
      file_count: Object.keys(PROJECT).length,
    });
    expect(r.default_seed).toEqual({ origin: "project_path", path: fx.project });
    return r;
  },
  workspace_list: async (fx) => {
    const w = await seeded(fx);
    const r = await fx.ok("workspace_list");
    expect(r.count).toBeGreaterThanOrEqual(1);
    expect(r.workspaces[0]).toMatchObject({
      workspace_id: w.workspace_id,
      command_count: 0,
      service_count: 0,
    });
    return r;
  },
  workspace_update: async (fx) => {
    const w = await fx.pyro.createWorkspace({ labels: { a: "1", b: "2" } });
    const name = uniqueName();
    const r = await fx.ok("workspace_update", {
      workspace_id: w.workspace_id,
      name,
      labels: { c: "3" },
      clear_labels: ["a"],
    });
    expect(r).toMatchObject({ workspace_id: w.workspace_id, name, labels: { b: "2", c: "3" } });
    return r;
  },
  workspace_status: async (fx) => {
    const name = uniqueName();
    const w = await fx.pyro.createWorkspace({ seedPath: fx.project, name });
    const r = await fx.ok("workspace_status", { workspace_id: name });
    expect(r).toMatchObject({
      workspace_id: w.workspace_id,
      state: "running",
      reset_count: 0,
      current_snapshot: "baseline",
    });
    return r;
  },
  workspace_sync_push: async (fx) => {
    const w = await seeded(fx);
    await mkdir(join(fx.base, "extra"), { recursive: true });
    await writeFile(join(fx.base, "extra", "data.txt"), "pushed\n");
    const r = await fx.ok("workspace_sync_push", {
      workspace_id: w.workspace_id,
      source_path: "extra",
      dest: "/workspace/in",
    });
    expect(r).toMatchObject({ source: join(fx.base, "extra"), files: 1 });
    expect((await fx.pyro.readWorkspaceFile(w.workspace_id, "in/data.txt")).content).toBe("pushed\n");
    return r;
  },
  workspace_exec: async (fx) => {
    const w = await seeded(fx);
    const call = await fx.call("workspace_exec", { workspace_id: w.workspace_id, command: "sh check.sh" });
    // A failing command is a result, not a tool error.
    expect(call.isError).toBeFalsy();
    const r = call.structuredContent as any;
    expect(r).toMatchObject({
      exit_code: 1,
      stdout: "",
      timed_out: false,
      truncated: false,
      execution_mode: "guest_agent",
      seq: 1,
    });
    expect(r.stderr).toContain("should be 5");
    expect((call.content[0] as { text: string }).text).toMatch(/^exit 1 in \d+ ms/);
    return r;
  },
  workspace_logs: async (fx) => {
    const w = await seeded(fx);
    await fx.pyro.execWorkspace(w.workspace_id, "echo one");
    const r = await fx.ok("workspace_logs", { workspace_id: w.workspace_id });
    expect(r).toMatchObject({
      count: 1,
      commands: [{ seq: 1, command: "echo one", exit_code: 0, stdout: "one\n" }],
    });
    return r;
  },
  workspace_summary: async (fx) => {
    const w = await seeded(fx);
    await fx.pyro.execWorkspace(w.workspace_id, "sh check.sh");
    await fx.pyro.writeWorkspaceFile(w.workspace_id, "notes.txt", "n\n");
    const r = await fx.ok("workspace_summary", { workspace_id: w.workspace_id });
    expect(r.outcome).toMatchObject({
      command_count: 1,
      last_command: { command: "sh check.sh", exit_code: 1 },
      reset_count: 0,
    });
    expect(r.changes).toMatchObject({
      available: true,
      changed: true,
      entries: [{ path: "notes.txt", status: "added" }],
    });
    expect(r.edits.recent[0]).toMatchObject({ kind: "file_write" });
    return r;
  },
  workspace_file_list: async (fx) => {
    const w = await seeded(fx);
    const r = await fx.ok("workspace_file_list", { workspace_id: w.workspace_id, recursive: true });
    expect(r.entries.map((e: { path: string }) => e.path).sort()).toEqual([
      "calc.sh",
      "check.sh",
      "docs",
      "docs/readme.txt",
    ]);
    expect(r.entries.find((e: { path: string }) => e.path === "docs")).toMatchObject({
      artifact_type: "directory",
    });
    return r;
  },
  workspace_file_read: async (fx) => {
    const w = await seeded(fx);
    const r = await fx.ok("workspace_file_read", { workspace_id: w.workspace_id, path: "calc.sh" });
    expect(r).toMatchObject({ content: PROJECT["calc.sh"], encoding: "utf8", truncated: false });
    const bare = await fx.call("workspace_file_read", {
      workspace_id: w.workspace_id,
      path: "/workspace/calc.sh",
      content_only: true,
    });
    expect(bare.content).toEqual([{ type: "text", text: PROJECT["calc.sh"] }]);
    return r;
  },
  workspace_file_write: async (fx) => {
    const w = await seeded(fx);
    const r = await fx.ok("workspace_file_write", {
      workspace_id: w.workspace_id,
      path: "new/dir/file.txt",
      text: "quote ' \" $HOME\n",
    });
    expect(r).toMatchObject({ created: true, size_bytes: 16 });
    expect((await fx.pyro.readWorkspaceFile(w.workspace_id, "new/dir/file.txt")).content).toBe(
      "quote ' \" $HOME\n",
    );
    return r;
  },
  workspace_patch_apply: async (fx) => {
    const w = await seeded(fx);
    const r = await fx.ok("workspace_patch_apply", { workspace_id: w.workspace_id, patch: FIX });
    expect(r).toEqual({
      workspace_id: w.workspace_id,
      changed: true,
      files: [{ path: "calc.sh", status: "modified" }],
    });
    expect((await fx.pyro.execWorkspace(w.workspace_id, "sh check.sh")).exit_code).toBe(0);
    return r;
  },
  workspace_diff: async (fx) => {
    const w = await seeded(fx);
    await fx.pyro.applyWorkspacePatch(w.workspace_id, FIX);
    const r = await fx.ok("workspace_diff", { workspace_id: w.workspace_id });
    expect(r).toMatchObject({
      changed: true,
      base_snapshot: "baseline",
      summary: { total: 1, modified: 1 },
      entries: [{ path: "calc.sh", status: "modified" }],
    });
    expect(r.patch).toContain("+add() { echo $(($1 + $2)); }");
    return r;
  },
  workspace_export: async (fx) => {
    const w = await seeded(fx);
    const r = await fx.ok("workspace_export", {
      workspace_id: w.workspace_id,
      path: "calc.sh",
      output_path: "out/calc.sh",
    });
    expect(r).toMatchObject({ output_path: join(fx.base, "out", "calc.sh"), artifact_type: "file" });
    expect(await readFile(join(fx.base, "out", "calc.sh"), "utf8")).toBe(PROJECT["calc.sh"]);
    return r;
  },
  workspace_reset: async (fx) => {
    const w = await seeded(fx);
    await fx.pyro.applyWorkspacePatch(w.workspace_id, FIX);
    const r = await fx.ok("workspace_reset", { workspace_id: w.workspace_id });
    expect(r).toMatchObject({
      reset_count: 1,
      workspace_reset: { snapshot_name: "baseline" },
      state: "running",
    });
    expect((await fx.pyro.readWorkspaceFile(w.workspace_id, "calc.sh")).content).toBe(PROJECT["calc.sh"]);
    return r;
  },
  workspace_delete: async (fx) => {
    const w = await seeded(fx);
    const r = await fx.ok("workspace_delete", { workspace_id: w.workspace_id });
    expect(r).toMatchObject({ workspace_id: w.workspace_id, deleted: true });
    expect((await fx.pyro.listWorkspaces()).workspaces.map((x) => x.workspace_id)).not.toContain(
      w.workspace_id,
    );
    return r;
  },
  snapshot_create: async (fx) => {
    const w = await seeded(fx);
    const r = await fx.ok("snapshot_create", { workspace_id: w.workspace_id, snapshot_name: "cp1" });
    expect(r).toMatchObject({ snapshot_name: "cp1", kind: "named", file_count: Object.keys(PROJECT).length });
    return r;
  },
  snapshot_list: async (fx) => {
    const w = await seeded(fx);
    await fx.pyro.createSnapshot(w.workspace_id, "cp1");
    const r = await fx.ok("snapshot_list", { workspace_id: w.workspace_id });
    expect(r.snapshots.map((s: { snapshot_name: string }) => s.snapshot_name).sort()).toEqual([
      "baseline",
      "cp1",
    ]);
    return r;
  },
  snapshot_delete: async (fx) => {
    const w = await seeded(fx);
    await fx.pyro.createSnapshot(w.workspace_id, "cp1");
    const r = await fx.ok("snapshot_delete", { workspace_id: w.workspace_id, snapshot_name: "cp1" });
    expect(r).toMatchObject({ snapshot_name: "cp1", deleted: true });
    return r;
  },
  workspace_disk_list: async (fx) => {
    const w = await seeded(fx);
    await fx.pyro.writeWorkspaceFile(w.workspace_id, "after.txt", "written before the stop");
    await fx.pyro.stopWorkspace(w.workspace_id);
    const r = await fx.ok("workspace_disk_list", { workspace_id: w.workspace_id, recursive: true });
    expect(r.entries.map((e: { path: string }) => e.path)).toEqual(
      expect.arrayContaining(["after.txt", "calc.sh"]),
    );
    expect((await fx.pyro.getWorkspace(w.workspace_id)).state).toBe("stopped");
    return r;
  },
  workspace_disk_read: async (fx) => {
    const w = await seeded(fx);
    await fx.pyro.stopWorkspace(w.workspace_id);
    const r = await fx.ok("workspace_disk_read", { workspace_id: w.workspace_id, path: "calc.sh" });
    expect(r).toMatchObject({ content: PROJECT["calc.sh"], encoding: "utf8" });
    return r;
  },
  workspace_disk_export: async (fx) => {
    const w = await seeded(fx);
    await fx.pyro.stopWorkspace(w.workspace_id);
    const r = await fx.ok("workspace_disk_export", {
      workspace_id: w.workspace_id,
      path: "calc.sh",
      output_path: "disk-out/calc.sh",
    });
    expect(r).toMatchObject({ output_path: join(fx.base, "disk-out", "calc.sh"), artifact_type: "file" });
    expect(await readFile(join(fx.base, "disk-out", "calc.sh"), "utf8")).toBe(PROJECT["calc.sh"]);
    return r;
  },
  workspace_stop: async (fx) => {
    const w = await seeded(fx);
    const r = await fx.ok("workspace_stop", { workspace_id: w.workspace_id });
    expect(r.state).toBe("stopped");
    return r;
  },
  workspace_network_blocks: async (fx) => {
    const w = await seeded(fx);
    fx.pyro.engine.store().recordNetworkBlock(w.workspace_id, {
      kind: "network",
      target: "blocked.test:443",
      reason: "not in the workspace's allowlist",
    });
    const r = await fx.ok("workspace_network_blocks", { workspace_id: w.workspace_id });
    expect(r).toMatchObject({ workspace_id: w.workspace_id, network_policy: "off", count: 1 });
    expect(r.blocks[0]).toMatchObject({ kind: "network", target: "blocked.test:443", count: 1 });
    return r;
  },
  service_start: async (fx) => {
    const w = await seeded(fx);
    const r = await fx.ok("service_start", {
      workspace_id: w.workspace_id,
      service_name: "web",
      command: "echo up > up.txt; sleep 30",
      readiness: { type: "file", path: "up.txt", timeout_seconds: 10 },
    });
    expect(r).toMatchObject({ name: "web", state: "ready", ready: { kind: "file", path: "up.txt" } });
    expect(r.ready_at).toBeTruthy();
    await fx.pyro.stopService(w.workspace_id, "web", { graceSeconds: 0 });
    return r;
  },
  service_list: async (fx) => {
    const w = await seeded(fx);
    await fx.pyro.startService(w.workspace_id, "web", "sleep 30");
    const r = await fx.ok("service_list", { workspace_id: w.workspace_id });
    expect(r).toMatchObject({ count: 1, running_count: 1 });
    expect(r.services[0]).toMatchObject({ name: "web", command: "sleep 30" });
    await fx.pyro.stopService(w.workspace_id, "web", { graceSeconds: 0 });
    return r;
  },
  service_status: async (fx) => {
    const w = await seeded(fx);
    await fx.pyro.startService(w.workspace_id, "web", "sleep 30");
    const r = await fx.ok("service_status", { workspace_id: w.workspace_id, service_name: "web" });
    expect(r).toMatchObject({ name: "web", state: "ready" });
    expect(r.pid).toBeGreaterThan(0);
    await fx.pyro.stopService(w.workspace_id, "web", { graceSeconds: 0 });
    return r;
  },
  service_logs: async (fx) => {
    const w = await seeded(fx);
    await fx.pyro.startService(w.workspace_id, "web", "echo hello; echo oops >&2; touch done; sleep 30", {
      readiness: { type: "file", path: "done" },
    });
    const r = await fx.ok("service_logs", {
      workspace_id: w.workspace_id,
      service_name: "web",
      tail_lines: 10,
    });
    expect(r.lines).toEqual(
      expect.arrayContaining([
        { stream: "stdout", text: "hello" },
        { stream: "stderr", text: "oops" },
      ]),
    );
    await fx.pyro.stopService(w.workspace_id, "web", { graceSeconds: 0 });
    return r;
  },
  service_stop: async (fx) => {
    const w = await seeded(fx);
    await fx.pyro.startService(w.workspace_id, "web", "sleep 30");
    const r = await fx.ok("service_stop", { workspace_id: w.workspace_id, service_name: "web" });
    expect(r).toMatchObject({ name: "web", state: "stopped" });
    return r;
  },
  shell_open: async (fx) => {
    const w = await seeded(fx);
    const r = await fx.ok("shell_open", { workspace_id: w.workspace_id, cols: 100, rows: 30 });
    expect(r).toMatchObject({ state: "running", cols: 100, rows: 30, cwd: "/workspace" });
    expect(r.shell_id).toMatch(/^sh_[0-9a-f]{12}$/);
    await fx.pyro.closeShell(w.workspace_id, r.shell_id);
    return r;
  },
  shell_write: async (fx) => {
    const w = await seeded(fx);
    const sh = await fx.pyro.openShell(w.workspace_id);
    const r = await fx.ok("shell_write", {
      workspace_id: w.workspace_id,
      shell_id: sh.shell_id,
      input: "echo wr$((6*7))",
    });
    expect(r.bytes).toBe("echo wr$((6*7))".length + 1);
    const read = await fx.pyro.readShell(w.workspace_id, sh.shell_id, { waitForIdleMs: 300, plain: true });
    expect(read.output).toContain("wr42");
    await fx.pyro.closeShell(w.workspace_id, sh.shell_id);
    return r;
  },
  shell_read: async (fx) => {
    const w = await seeded(fx);
    const sh = await fx.pyro.openShell(w.workspace_id);
    await fx.pyro.writeShell(w.workspace_id, sh.shell_id, "printf '\\033[32mgreen\\033[0m\\n'");
    const r = await fx.ok("shell_read", {
      workspace_id: w.workspace_id,
      shell_id: sh.shell_id,
      wait_for_idle_ms: 300,
    });
    // Plain by default over MCP: the coloured word as text, no escape byte.
    expect(r.plain).toBe(true);
    expect(r.output).toMatch(/^green$/m);
    expect(r.output).not.toContain("\u001b");
    expect(r.next_cursor).toBeGreaterThan(r.cursor);
    await fx.pyro.closeShell(w.workspace_id, sh.shell_id);
    return r;
  },
  shell_signal: async (fx) => {
    const w = await seeded(fx);
    const sh = await fx.pyro.openShell(w.workspace_id);
    await fx.pyro.writeShell(w.workspace_id, sh.shell_id, "sleep 60; echo after-$((1+1))");
    await fx.pyro.readShell(w.workspace_id, sh.shell_id, { waitForIdleMs: 200 });
    const r = await fx.ok("shell_signal", {
      workspace_id: w.workspace_id,
      shell_id: sh.shell_id,
      signal: "INT",
    });
    expect(r).toMatchObject({ signal: "INT", state: "running" });
    // The sleep died and the rest of the line was abandoned: the prompt is back, no "after-2".
    await fx.pyro.writeShell(w.workspace_id, sh.shell_id, "echo back-$((2+2))");
    // Read until the answer shows (an idle pause on a loaded machine can come before it),
    // keeping everything read: whatever the abandoned line printed would be in it too.
    let output = "";
    for (let i = 0; i < 40 && !output.includes("back-4"); i++)
      output += (await fx.pyro.readShell(w.workspace_id, sh.shell_id, { waitForIdleMs: 300, plain: true }))
        .output;
    expect(output).toContain("back-4");
    expect(output).not.toContain("after-2");
    await fx.pyro.closeShell(w.workspace_id, sh.shell_id);
    return r;
  },
  shell_close: async (fx) => {
    const w = await seeded(fx);
    const sh = await fx.pyro.openShell(w.workspace_id);
    const r = await fx.ok("shell_close", { workspace_id: w.workspace_id, shell_id: sh.shell_id });
    expect(r).toMatchObject({ closed: true, state: "exited" });
    expect((await fx.pyro.listShells(w.workspace_id)).count).toBe(0);
    return r;
  },
  environment_build: async (fx) => {
    // The fake backend cannot save a root layer: the recipe's entry is put in the cache as
    // a finished build leaves it, and the tool must find it by the recipe's key.
    const name = `mcp-env-${Date.now().toString(36)}`;
    const base = await fx.pyro.pullEnvironment("debian:12");
    const recipe = checkRecipe({ name, from: "debian:12", apt: ["jq"], run: ["true"] }, "/");
    const spec = {
      name,
      description: "built from debian:12",
      source: await recipeSource(recipe, base.recipe_key),
    };
    const key = recipeKey(spec);
    const dir = join(fx.pyro.engine.environments.root, entryDirName(spec, key));
    await mkdir(join(dir, "rootfs"), { recursive: true });
    await writeFile(
      join(dir, "manifest.json"),
      JSON.stringify({
        ...spec,
        recipe_key: key,
        source_detail: {},
        built_at: new Date().toISOString(),
        build_duration_ms: 1,
        size_bytes: 1,
        file_count: 0,
      }),
    );
    const r = await fx.ok("environment_build", { name, from: "debian:12", apt: ["jq"], run: ["true"] });
    expect(r).toMatchObject({ name, cache_hit: true, recipe_key: key });
    // An official name is refused; host files (copy) are not an MCP argument.
    expect(
      (await fx.fails("environment_build", { name: "debian:12", from: "debian:12", run: ["true"] })).code,
    ).toBe("invalid_argument");
    expect(
      (await fx.fails("environment_build", { name: "x", from: "debian:12", copy: ["/etc/passwd:/x"] })).code,
    ).toBe("invalid_argument");
    return r;
  },
  workspace_commit: async (fx) => {
    // Outside the project: other tools' checks count the project's files.
    const scratch = await mkdtemp(join(tmpdir(), "pyro-mcp-commit-"));
    const repo = join(scratch, "repo");
    const { git } = await makeGitRepo(repo, { "a.txt": "one\n" }, "seed");
    const w = await fx.pyro.createWorkspace({ seedPath: repo, name: "committer" });
    await fx.pyro.writeWorkspaceFile(w.workspace_id, "a.txt", "two\n");
    const r = await fx.ok("workspace_commit", { workspace_id: w.workspace_id, message: "Change a" });
    expect(r).toMatchObject({
      branch: "pyro/committer",
      repository: repo,
      files: [{ path: "a.txt", status: "modified" }],
    });
    expect(git("show", "pyro/committer:a.txt")).toBe("two\n");
    expect(git("rev-parse", "--abbrev-ref", "HEAD").trim()).toBe("main");
    // A model moves only its own branches.
    const refused = await fx.fails("workspace_commit", {
      workspace_id: w.workspace_id,
      branch: "main",
      force: true,
    });
    expect(refused.code).toBe("invalid_argument");
    await fx.pyro.deleteWorkspace(w.workspace_id);
    await rm(scratch, { recursive: true, force: true });
    return r;
  },
  workspace_start: async (fx) => {
    const w = await seeded(fx);
    await fx.pyro.stopWorkspace(w.workspace_id);
    const r = await fx.ok("workspace_start", { workspace_id: w.workspace_id });
    expect(r.state).toBe("running");
    return r;
  },
};

/** Arguments with a number where a string goes (or an unknown argument where there is no string). */
function malformed(tool: ToolName): { args: Record<string, unknown>; mentions: string } {
  if (tool === "vm_run") return { args: { command: 42 }, mentions: "command" };
  if (tool === "workspace_create") return { args: { name: 42 }, mentions: "name" };
  if (tool === "workspace_list") return { args: { bogus: true }, mentions: "bogus" };
  if (tool === "environment_build") return { args: { name: 42, from: "debian:12" }, mentions: "name" };
  return { args: { workspace_id: 42 }, mentions: "workspace_id" };
}

const selections = [
  ...PROFILE_NAMES.map((profile) => ({ label: `profile ${profile}`, name: profile, options: { profile } })),
  ...MODE_NAMES.map((mode) => ({ label: `mode ${mode}`, name: mode, options: { mode } })),
];

for (const sel of selections) {
  describe(`MCP server, ${sel.label}`, () => {
    let fx: McpFixture;
    const definitions = new Map<string, ToolDefinition>(
      toolDefinitions(toolSet(sel.options)).map((t) => [t.name, t]),
    );
    beforeAll(async () => {
      fx = await mcpFixture(sel.options);
    });
    afterAll(async () => {
      await fx.cleanup();
    });

    it("lists exactly the pinned tools, each with input and output schemas, annotations and a description", async () => {
      const { tools } = await fx.client.listTools();
      expect(tools.map((t) => t.name)).toEqual(PINNED[sel.name]);
      for (const t of tools) {
        const name = t.name as ToolName;
        expect(t.inputSchema).toMatchObject({ type: "object", additionalProperties: false });
        expect(t.outputSchema).toMatchObject({
          type: "object",
          anyOf: [{ required: expect.any(Array) }, { required: ["error"] }],
        });
        expect(t.outputSchema?.properties).toHaveProperty("error");
        expect(t.title).toBeTruthy();
        expect(t.annotations).toMatchObject({
          readOnlyHint: READ_ONLY.includes(name),
          // Only an environment build always reaches outside (it fetches packages).
          openWorldHint: name === "environment_build",
          ...(READ_ONLY.includes(name)
            ? {}
            : { destructiveHint: DESTRUCTIVE.includes(name), idempotentHint: IDEMPOTENT.includes(name) }),
        });
        expect(t.description?.length).toBeGreaterThan(80);
        // Descriptions (and their "Next:" advice) name only tools this server has.
        for (const other of TOOL_NAMES.filter((n) => !PINNED[sel.name]!.includes(n))) {
          expect(t.description, `${name} mentions ${other}`).not.toMatch(new RegExp(`\\b${other}\\b`));
        }
        if (!WITHOUT_WORKSPACE.includes(name)) expect(t.inputSchema.required).toContain("workspace_id");
        // What exec says about leftover processes matches what the agent does
        // (tests/unit/agent/exec-leftovers.test.ts): jobs end, nohup/setsid survive.
        if (name === "workspace_exec") {
          expect(t.description).toMatch(/Background jobs .* end when the call returns/);
          expect(t.description).toMatch(/nohup/);
          expect(t.description).not.toMatch(/processes .* do not/);
        }
      }
    });

    for (const tool of PINNED[sel.name]! as ToolName[]) {
      it(`${tool}: a happy-path call returns structuredContent matching its output schema`, async () => {
        const structured = await HAPPY[tool](fx);
        const parsed = definitions.get(tool)!.output.safeParse(structured);
        expect(parsed.success, parsed.success ? "" : parsed.error.message).toBe(true);
      });

      it(`${tool}: malformed arguments are an invalid_argument result`, async () => {
        const { args, mentions } = malformed(tool);
        const error = await fx.fails(tool, args);
        expect(error.code).toBe("invalid_argument");
        expect(error.message).toContain(mentions);
      });

      if (!WITHOUT_WORKSPACE.includes(tool)) {
        it(`${tool}: an unknown workspace is workspace_not_found`, async () => {
          const args: Record<string, unknown> = {
            workspace_id: "no-such-workspace",
            command: "true",
            path: "calc.sh",
            text: "x",
            patch: FIX,
            output_path: "never",
            source_path: ".",
            snapshot_name: "cp1",
            service_name: "web",
            shell_id: "sh_0123456789ab",
            input: "true",
            signal: "INT",
          };
          const shape = definitions.get(tool)!.input.shape as Record<string, unknown>;
          const error = await fx.fails(
            tool,
            Object.fromEntries(Object.entries(args).filter(([k]) => k in shape)),
          );
          expect(error.code).toBe("workspace_not_found");
          expect(error.hint).toContain("workspace_list");
        });
      }
    }

    it("keeps serving after errors", async () => {
      const first = PINNED[sel.name]![0] as ToolName;
      await fx.fails(first, malformed(first).args);
      await fx.fails("no_such_tool", {});
      expect((await fx.client.listTools()).tools).toHaveLength(PINNED[sel.name]!.length);
      await HAPPY[first](fx);
    });
  });
}

describe("MCP error results", () => {
  let fx: McpFixture;
  beforeAll(async () => {
    fx = await mcpFixture({ profile: "workspace-full" });
  });
  afterAll(async () => {
    await fx.cleanup();
  });

  it("refuses paths that leave /workspace with path_outside_workspace and changes nothing", async () => {
    const w = await seeded(fx);
    const id = w.workspace_id;
    for (const [tool, args] of [
      ["workspace_file_read", { workspace_id: id, path: "../../etc/passwd" }],
      ["workspace_file_write", { workspace_id: id, path: "/etc/pyro-escape", text: "x" }],
      ["workspace_file_list", { workspace_id: id, path: "/workspace/../.." }],
      ["workspace_export", { workspace_id: id, path: "../..", output_path: "escape-out" }],
    ] as const) {
      expect((await fx.fails(tool, args)).code, tool).toBe("path_outside_workspace");
    }
    expect(existsSync("/etc/pyro-escape")).toBe(false);
    expect(existsSync(join(fx.base, "escape-out"))).toBe(false);
    expect((await fx.pyro.diffWorkspace(id)).changed).toBe(false);
  });

  it("rejects a patch that does not apply with patch_rejected, naming the hunk, and changes nothing", async () => {
    const w = await seeded(fx);
    const bad = FIX.replace("-add() { echo $(($1 - $2)); }", "-add() { echo $(($1 * $2)); }");
    const error = await fx.fails("workspace_patch_apply", { workspace_id: w.workspace_id, patch: bad });
    expect(error.code).toBe("patch_rejected");
    expect(error.message).toContain("calc.sh");
    expect((await fx.pyro.readWorkspaceFile(w.workspace_id, "calc.sh")).content).toBe(PROJECT["calc.sh"]);
  });

  it("reports lifecycle and lookup failures with their codes and tool-named hints", async () => {
    const w = await seeded(fx);
    await fx.pyro.stopWorkspace(w.workspace_id);
    const stopped = await fx.fails("workspace_exec", { workspace_id: w.workspace_id, command: "true" });
    expect(stopped).toMatchObject({
      code: "workspace_stopped",
      hint: expect.stringContaining("workspace_start"),
    });
    await fx.pyro.startWorkspace(w.workspace_id);
    expect((await fx.fails("workspace_reset", { workspace_id: w.workspace_id, snapshot: "nope" })).code).toBe(
      "not_found",
    );
    expect((await fx.fails("workspace_exec", { workspace_id: w.workspace_id, command: "   " })).code).toBe(
      "invalid_argument",
    );
    expect((await fx.fails("workspace_create", { environment: "nope:1" })).code).toBe(
      "environment_not_found",
    );
    const unknown = await fx.fails("no_such_tool", {});
    expect(unknown).toMatchObject({ code: "not_found", hint: expect.stringContaining("workspace_create") });
  });

  it("never picks the host backend unless the server allows host compat", async () => {
    expect((await fx.fails("workspace_create", { backend: "host" })).code).toBe("backend_unavailable");
    expect((await fx.fails("vm_run", { command: "true", backend: "host" })).code).toBe("backend_unavailable");
  });

  it("offers network_policy on create in workspace-full only, and refuses what the build cannot do", async () => {
    expect((await fx.fails("workspace_create", { network_policy: "egress" })).code).toBe(
      "backend_unavailable",
    );
    expect((await fx.ok("workspace_create", { network_policy: "off" })).network_policy).toBe("off");
    const core = await mcpFixture();
    try {
      const error = await core.fails("workspace_create", { network_policy: "off" });
      expect(error).toMatchObject({
        code: "invalid_argument",
        message: expect.stringContaining("network_policy"),
      });
    } finally {
      await core.cleanup();
    }
  });

  it("takes secrets on create in workspace-full: injected, redacted, never echoed back", async () => {
    const w = await fx.ok("workspace_create", { secrets: { API_TOKEN: "tok-1234567890" } });
    expect(w.secrets).toEqual([{ name: "API_TOKEN", kind: "literal" }]);
    expect(JSON.stringify(w)).not.toContain("tok-1234567890");
    const r = await fx.ok("workspace_exec", {
      workspace_id: w.workspace_id,
      command: 'test "$API_TOKEN" = tok-1234567890 && echo "$API_TOKEN"',
    });
    expect(r.exit_code).toBe(0);
    expect(r.stdout).not.toContain("tok-1234567890");
    // The server's environment has no such variable; prompting needs a terminal MCP does not have.
    // biome-ignore lint/suspicious/noTemplateCurlyInString: a secret spec, not a template
    const unset = "${NOT_SET_ANYWHERE}";
    expect((await fx.fails("workspace_create", { secrets: { A: unset } })).code).toBe("invalid_argument");
    expect((await fx.fails("workspace_create", { secrets: { A: "?" } })).code).toBe("invalid_argument");
    const core = await mcpFixture();
    try {
      expect((await core.fails("workspace_create", { secrets: { A: "x" } })).code).toBe("invalid_argument");
    } finally {
      await core.cleanup();
    }
  });

  it("refuses unknown arguments (a misspelt seed_path must not silently give an empty workspace)", async () => {
    const error = await fx.fails("workspace_create", { seed: fx.project });
    expect(error).toMatchObject({ code: "invalid_argument", message: expect.stringContaining("seed") });
  });
});
