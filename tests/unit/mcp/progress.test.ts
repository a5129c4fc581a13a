import { existsSync } from "node:fs";
import { join } from "node:path";
import type { Progress } from "@modelcontextprotocol/sdk/types.js";
import { afterEach, describe, expect, it } from "vitest";
import { NO_SEED } from "../../../src/mcp/seed.js";
import { toolHint } from "../../../src/mcp/server.js";
import { type McpFixture, mcpFixture } from "./helpers.js";

let fx: McpFixture | undefined;
afterEach(async () => {
  await fx?.cleanup();
  fx = undefined;
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("MCP progress and cancellation", () => {
  it("sends progress notifications while an environment is built for a create", async () => {
    fx = await mcpFixture({ builderDelayMs: 1500 });
    const seen: Progress[] = [];
    const r = await fx.call("workspace_create", {}, { onprogress: (p) => seen.push(p) });
    expect(r.isError).toBeFalsy();
    const messages = seen.map((p) => p.message ?? "");
    expect(messages.some((m) => m.startsWith("environment unpack"))).toBe(true);
    expect(messages.some((m) => /^creating the workspace: \d+s$/.test(m))).toBe(true);
    // progress grows with every notification, as the spec requires.
    const values = seen.map((p) => p.progress);
    expect(values).toEqual([...values].sort((a, b) => a - b));
    expect(new Set(values).size).toBe(values.length);
  });

  it("sends nothing when the client did not ask for progress", async () => {
    fx = await mcpFixture();
    const notes: unknown[] = [];
    fx.client.fallbackNotificationHandler = async (n) => {
      notes.push(n);
    };
    const w = await fx.pyro.createWorkspace({});
    const r = await fx.call("workspace_exec", { workspace_id: w.workspace_id, command: "sleep 1.2" });
    expect(r.isError).toBeFalsy();
    expect(notes).toEqual([]);
  });

  it("stops the command when the client cancels the call", async () => {
    fx = await mcpFixture();
    const w = await fx.pyro.createWorkspace({});
    const abort = new AbortController();
    const pending = fx.call(
      "workspace_exec",
      { workspace_id: w.workspace_id, command: "sleep 1; touch marker" },
      { signal: abort.signal },
    );
    await sleep(300);
    abort.abort();
    await expect(pending).rejects.toThrow();
    await sleep(1500);
    // The command's process tree was killed: the marker never appeared, nothing was recorded.
    const files = await fx.pyro.listWorkspaceFiles(w.workspace_id);
    expect(files.entries.map((e) => e.path)).not.toContain("marker");
    expect((await fx.pyro.workspaceLogs(w.workspace_id)).count).toBe(0);
    // And the server still answers.
    expect(
      (await fx.ok("workspace_exec", { workspace_id: w.workspace_id, command: "echo alive" })).stdout,
    ).toBe("alive\n");
  });

  it("stops every call in flight on a server shutdown", async () => {
    const shutdown = new AbortController();
    fx = await mcpFixture({ shutdown: shutdown.signal });
    const w = await fx.pyro.createWorkspace({});
    const pending = fx.call("workspace_exec", { workspace_id: w.workspace_id, command: "sleep 5" });
    await sleep(300);
    shutdown.abort();
    const r = await pending;
    expect(r.isError).toBe(true);
    expect((r.structuredContent as { error: { code: string } }).error.code).toBe("cancelled");
  });
});

describe("MCP default seed", () => {
  it("creates an empty workspace when the server has no default seed", async () => {
    fx = await mcpFixture({ seed: NO_SEED });
    const r = await fx.ok("workspace_create", {});
    expect(r.workspace_seed).toMatchObject({ kind: "empty", source: null, file_count: 0 });
    expect(r).not.toHaveProperty("default_seed");
  });

  it("prefers an explicit seed_path, resolved against the server's base directory", async () => {
    fx = await mcpFixture();
    const r = await fx.ok("workspace_create", { seed_path: "project/docs" });
    expect(r.workspace_seed).toMatchObject({
      kind: "directory",
      source: join(fx.project, "docs"),
      file_count: 1,
    });
    expect(r).not.toHaveProperty("default_seed");
    expect(existsSync(join(fx.project, "docs", "readme.txt"))).toBe(true);
  });

  it("names the default seed in workspace_create's description and the server instructions", async () => {
    fx = await mcpFixture();
    const create = (await fx.client.listTools()).tools.find((t) => t.name === "workspace_create");
    expect(create?.description).toContain(fx.project);
    expect(fx.client.getInstructions()).toContain(fx.project);
  });
});

describe("error hints", () => {
  it("name the tool instead of the CLI command where a tool exists", () => {
    expect(toolHint("list workspaces with `pyro workspace list`")).toBe(
      "list workspaces with workspace_list",
    );
    expect(toolHint("start it first: pyro workspace start ws_0123456789ab")).toBe(
      "start it first: workspace_start",
    );
    expect(toolHint("list them with `pyro workspace snapshot list`")).toBe("list them with snapshot_list");
    expect(toolHint("run `pyro doctor` for details")).toBe("run `pyro doctor` for details");
  });
});
