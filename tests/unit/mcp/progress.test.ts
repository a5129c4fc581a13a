import { existsSync } from "node:fs";
import { join } from "node:path";
import type { Progress } from "@modelcontextprotocol/sdk/types.js";
import { afterEach, describe, expect, it } from "vitest";
import { ACTIONS, PyroError } from "../../../src/errors.js";
import { NO_SEED } from "../../../src/mcp/seed.js";
import { errorResult } from "../../../src/mcp/server.js";
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
    // Log messages and resource list changes (the create's) are other capabilities'.
    expect(notes.filter((n) => (n as { method: string }).method === "notifications/progress")).toEqual([]);
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
  it("carry a structured action that each surface names its own way", () => {
    const e = new PyroError("workspace_not_found", "no workspace 'x'", "list workspaces with {action}", {
      action: ACTIONS.listWorkspaces,
    });
    expect(e.hint).toBe("list workspaces with `pyro workspace list`");
    expect(e.toJSON()).toEqual({
      code: "workspace_not_found",
      message: "no workspace 'x'",
      hint: "list workspaces with `pyro workspace list`",
    });
    expect(errorResult(e).structuredContent).toEqual({
      error: {
        code: "workspace_not_found",
        message: "no workspace 'x'",
        hint: "list workspaces with workspace_list",
      },
    });
    // Without a tool, MCP names the command too (the user can run it); without {action}, it is appended.
    const doctor = new PyroError("backend_unavailable", "no", "see", { action: { cli: "pyro doctor" } });
    expect(doctor.hintFor("tool")).toBe("see: `pyro doctor`");
    const start = ACTIONS.startWorkspace("ws_0123456789ab");
    expect(
      new PyroError("workspace_stopped", "s", "start it first with {action}", { action: start }).hintFor(
        "tool",
      ),
    ).toBe("start it first with workspace_start");
  });

  it("keep their action through redaction", () => {
    const e = new PyroError("conflict", "token s3cret", "retry {action}", {
      action: ACTIONS.workspaceStatus,
    });
    const r = e.withTexts((t) => t.replace("s3cret", "[redacted]"));
    expect(r.message).toBe("token [redacted]");
    expect(r.hintFor("tool")).toBe("retry workspace_status");
  });
});
