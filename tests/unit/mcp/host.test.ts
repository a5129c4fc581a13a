import {
  LoggingMessageNotificationSchema,
  ResourceListChangedNotificationSchema,
  ResourceUpdatedNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MODE_NAMES, PROFILE_NAMES, TOOL_NAMES, toolSet } from "../../../src/mcp/profiles.js";
import { PROMPTS, promptsFor, renderPrompt } from "../../../src/mcp/prompts.js";
import { FIX, type McpFixture, mcpFixture } from "./helpers.js";

/** Host features on the fake backend, through an SDK client (in-memory transport). */
describe("MCP host features (in-process, fake backend)", () => {
  let f: McpFixture;
  const logs: { level: string; data: any }[] = [];
  let listChanged = 0;
  const updatedUris: string[] = [];
  beforeAll(async () => {
    f = await mcpFixture({ profile: "workspace-full", pageSize: 10 });
    f.client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
      logs.push(n.params as { level: string; data: any });
    });
    f.client.setNotificationHandler(ResourceListChangedNotificationSchema, () => {
      listChanged += 1;
    });
    f.client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => {
      updatedUris.push(n.params.uri);
    });
  });
  afterAll(async () => {
    await f?.cleanup();
  });
  const settle = () => new Promise((r) => setTimeout(r, 20));

  it("declares logging, prompts, resources and completions", () => {
    const caps = f.client.getServerCapabilities();
    expect(caps).toMatchObject({
      tools: {},
      logging: {},
      prompts: {},
      resources: { subscribe: true, listChanged: true },
      completions: {},
    });
  });

  it("paginates tools/list with an opaque cursor and refuses a bad one", async () => {
    const names: string[] = [];
    let cursor: string | undefined;
    let pages = 0;
    do {
      const r = await f.client.listTools(cursor ? { cursor } : {});
      expect(r.tools.length).toBeLessThanOrEqual(10);
      names.push(...r.tools.map((t) => t.name));
      cursor = r.nextCursor;
      pages += 1;
    } while (cursor);
    expect(names).toEqual([...toolSet({ profile: "workspace-full" }).tools]);
    expect(pages).toBe(Math.ceil(names.length / 10));
    await expect(f.client.listTools({ cursor: "not-a-cursor" })).rejects.toThrow(/invalid cursor/);
  });

  it("filters log messages by the level the client set", async () => {
    await f.client.setLoggingLevel("warning");
    logs.length = 0;
    await f.ok("workspace_create", { name: "quiet" });
    await f.fails("workspace_file_read", { workspace_id: "quiet", path: "../../etc/passwd" });
    await settle();
    // The create is a notice: filtered out; the refusal is a warning: sent.
    expect(logs.map((l) => l.level)).toEqual(["warning"]);
    expect(logs[0]?.data).toMatchObject({ kind: "tool", details: { tool: "workspace_file_read" } });

    await f.client.setLoggingLevel("info");
    logs.length = 0;
    await f.ok("workspace_create", { name: "loud" });
    await f.ok("workspace_stop", { workspace_id: "loud" });
    await f.ok("workspace_start", { workspace_id: "loud" });
    await f.ok("workspace_delete", { workspace_id: "loud" });
    await settle();
    const messages = logs.map((l) => `${l.level} ${l.data.message}`);
    expect(messages).toEqual([
      expect.stringMatching(
        /^notice workspace ws_\w+ \(loud\) created: debian:12 on bwrap, sandbox started$/,
      ),
      expect.stringMatching(/^info workspace ws_\w+ \(loud\): sandbox stopped$/),
      expect.stringMatching(/^info workspace ws_\w+ \(loud\): sandbox started on bwrap$/),
      expect.stringMatching(/^info workspace ws_\w+ \(loud\) deleted$/),
    ]);
    await expect(f.client.setLoggingLevel("loud" as never)).rejects.toThrow(
      /-32602.*unknown logging level 'loud'/,
    );
  });

  it("never sends a workspace's secret values in a log message", async () => {
    await f.client.setLoggingLevel("debug");
    logs.length = 0;
    const w = await f.ok("workspace_create", { name: "s3cr3t-keeper", secrets: { TOKEN: "s3cr3t" } });
    f.pyro.engine.events.emit({
      level: "info",
      kind: "sandbox",
      message: "leaking s3cr3t here",
      workspace_id: w.workspace_id,
    });
    await settle();
    const all = JSON.stringify(logs);
    expect(logs.length).toBeGreaterThanOrEqual(2);
    expect(all).not.toContain("s3cr3t here");
    expect(all).toContain("leaking [REDACTED:TOKEN] here");
    await f.ok("workspace_delete", { workspace_id: w.workspace_id });
  });

  it("lists the prompts of the tool set and renders them with its tools only", async () => {
    const { prompts } = await f.client.listPrompts();
    expect(prompts.map((p) => p.name)).toEqual([
      "repro-fix",
      "inspect",
      "cold-start",
      "review-eval",
      "parallel-workspaces",
    ]);
    expect(prompts[0]?.arguments).toContainEqual(
      expect.objectContaining({ name: "command", required: true }),
    );
    const r = await f.client.getPrompt({
      name: "repro-fix",
      arguments: { command: "sh check.sh", issue: "add is wrong" },
    });
    const text = String((r.messages[0]?.content as { text?: string } | undefined)?.text);
    expect(text).toContain("`sh check.sh`");
    expect(text).toContain("add is wrong");
    expect(text).toContain("workspace_patch_apply");
    await expect(f.client.getPrompt({ name: "repro-fix", arguments: {} })).rejects.toThrow(/needs command/);
    await expect(f.client.getPrompt({ name: "nope" })).rejects.toThrow(/no prompt 'nope'/);
  });

  it("reads a workspace's diff, summary, files and the workspace list as resources", async () => {
    listChanged = 0;
    const w = await f.ok("workspace_create", { name: "res" });
    await f.client.subscribeResource({ uri: `pyro://workspaces/${w.workspace_id}/diff` });
    await f.ok("workspace_patch_apply", { workspace_id: "res", patch: FIX });
    await settle();
    expect(listChanged).toBeGreaterThanOrEqual(1);
    expect(updatedUris).toContain(`pyro://workspaces/${w.workspace_id}/diff`);

    const diff = await f.client.readResource({ uri: `pyro://workspaces/${w.workspace_id}/diff` });
    expect(diff.contents[0]).toMatchObject({ mimeType: "text/x-diff" });
    expect((diff.contents[0] as { text: string }).text).toContain("+add() { echo $(($1 + $2)); }");

    const summary = await f.client.readResource({ uri: `pyro://workspaces/${w.workspace_id}/summary` });
    expect(JSON.parse((summary.contents[0] as { text: string }).text)).toMatchObject({ name: "res" });

    const file = await f.client.readResource({
      uri: `pyro://workspaces/${w.workspace_id}/files/docs/readme.txt`,
    });
    expect(file.contents[0]).toMatchObject({ mimeType: "text/plain", text: "hello\n" });
    const dir = await f.client.readResource({ uri: `pyro://workspaces/${w.workspace_id}/files/docs` });
    expect(JSON.parse((dir.contents[0] as { text: string }).text).entries).toHaveLength(1);

    const all = await f.client.readResource({ uri: "pyro://workspaces" });
    expect(JSON.parse((all.contents[0] as { text: string }).text).workspaces).toContainEqual(
      expect.objectContaining({ name: "res" }),
    );
    const listed = await f.client.listResources();
    expect(listed.resources.map((r) => r.uri)).toContain(`pyro://workspaces/${w.workspace_id}/diff`);
    const templates = await f.client.listResourceTemplates();
    expect(templates.resourceTemplates.map((t) => t.uriTemplate)).toEqual([
      "pyro://workspaces/{workspace_id}/summary",
      "pyro://workspaces/{workspace_id}/diff",
      "pyro://workspaces/{workspace_id}/files/{+path}",
    ]);
    await expect(f.client.readResource({ uri: "pyro://workspaces/ws_nope/diff" })).rejects.toThrow(/ws_nope/);
    // The file tools' rules: nothing outside /workspace, refused as invalid params with the code.
    for (const path of ["../../etc/passwd", "%2E%2E/%2E%2E/etc/passwd"]) {
      const err = await f.client
        .readResource({ uri: `pyro://workspaces/${w.workspace_id}/files/${path}` })
        .then(
          () => undefined,
          (e: unknown) => e as { code: number; data: { code: string } },
        );
      expect(err, path).toMatchObject({ code: -32602, data: { code: "path_outside_workspace" } });
    }
  });

  it("paginates resources/list", async () => {
    for (const n of ["p1", "p2", "p3", "p4", "p5"]) await f.ok("workspace_create", { name: n });
    const uris: string[] = [];
    let cursor: string | undefined;
    do {
      const r = await f.client.listResources(cursor ? { cursor } : {});
      expect(r.resources.length).toBeLessThanOrEqual(10);
      uris.push(...r.resources.map((x) => x.uri));
      cursor = r.nextCursor;
    } while (cursor);
    const { count } = await f.ok("workspace_list");
    expect(uris).toHaveLength(1 + 2 * count);
    expect(new Set(uris).size).toBe(uris.length);
  });

  it("pages workspace_list with limit and next_cursor", async () => {
    const { count, workspaces: all } = await f.ok("workspace_list");
    expect(count).toBeGreaterThan(4);
    const seen: string[] = [];
    let cursor: string | null = null;
    do {
      const r: any = await f.ok("workspace_list", { limit: 2, ...(cursor ? { cursor } : {}) });
      expect(r.count).toBe(count);
      expect(r.workspaces.length).toBeLessThanOrEqual(2);
      seen.push(...r.workspaces.map((w: { workspace_id: string }) => w.workspace_id));
      cursor = r.next_cursor;
    } while (cursor);
    expect(seen).toEqual(all.map((w: { workspace_id: string }) => w.workspace_id));
    expect((await f.fails("workspace_list", { cursor: "bogus" })).code).toBe("invalid_argument");
  });

  it("completes workspace names and ids, environments, snapshots, services and paths", async () => {
    const complete = async (ref: any, name: string, value: string, context?: Record<string, string>) =>
      (
        await f.client.complete({
          ref,
          argument: { name, value },
          ...(context ? { context: { arguments: context } } : {}),
        })
      ).completion.values;
    const prompt = (name: string) => ({ type: "ref/prompt", name });
    expect(await complete(prompt("repro-fix"), "workspace_id", "p")).toEqual(["p1", "p2", "p3", "p4", "p5"]);
    const ids = await complete(prompt("repro-fix"), "workspace_id", "ws_");
    expect(ids.length).toBeGreaterThanOrEqual(6);
    expect(await complete(prompt("repro-fix"), "environment", "debian:1")).toContain("debian:12");
    await f.ok("snapshot_create", { workspace_id: "p1", snapshot_name: "checkpoint-a" });
    expect(await complete(prompt("review-eval"), "snapshot", "check", { workspace_id: "p1" })).toEqual([
      "checkpoint-a",
    ]);
    await f.ok("service_start", { workspace_id: "p1", service_name: "web", command: "sleep 60" });
    expect(await complete(prompt("cold-start"), "service_name", "w", { workspace_id: "p1" })).toEqual([
      "web",
    ]);
    const files = { type: "ref/resource", uri: "pyro://workspaces/{workspace_id}/files/{+path}" };
    expect(await complete(files, "workspace_id", "p2")).toEqual(["p2"]);
    expect(await complete(files, "path", "do", { workspace_id: "p1" })).toEqual(["docs/"]);
    expect(await complete(files, "path", "docs/r", { workspace_id: "p1" })).toEqual(["docs/readme.txt"]);
    // No context, or an argument with nothing to offer: nothing, no error.
    expect(await complete(prompt("review-eval"), "snapshot", "")).toEqual([]);
    expect(await complete(prompt("repro-fix"), "command", "np")).toEqual([]);
    await expect(complete(prompt("nope"), "x", "")).rejects.toThrow(/no prompt/);
  });
});

describe("log messages of environment builds and reaped workspaces", () => {
  it("tells a watcher about a build and about an expired workspace it reaps", async () => {
    const fx = await mcpFixture({ profile: "workspace-full", builderDelayMs: 50 });
    try {
      const seen: { level: string; data: any }[] = [];
      let changed = 0;
      fx.client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
        seen.push(n.params as { level: string; data: any });
      });
      fx.client.setNotificationHandler(ResourceListChangedNotificationSchema, () => {
        changed += 1;
      });
      await fx.client.setLoggingLevel("info");
      const w = await fx.ok("workspace_create", { name: "brief", ttl_seconds: 1 });
      const env = seen
        .filter((l) => l.data.kind === "environment")
        .map((l) => `${l.level} ${l.data.message}`);
      expect(env[0]).toBe("notice environment debian:12: building (this can take a minute)");
      expect(env.at(-1)).toMatch(/^notice environment debian:12: built in \d+\.\d s$/);
      // A cached environment says nothing.
      seen.length = 0;
      await fx.ok("workspace_create", { name: "second" });
      expect(seen.filter((l) => l.data.kind === "environment")).toEqual([]);

      await new Promise((r) => setTimeout(r, 1100));
      changed = 0;
      seen.length = 0;
      const list = await fx.ok("workspace_list");
      expect(list.workspaces.map((x: { name: string }) => x.name)).toEqual(["second"]);
      await new Promise((r) => setTimeout(r, 20));
      expect(seen).toContainEqual({
        level: "notice",
        logger: "pyro",
        data: expect.objectContaining({
          kind: "workspace",
          message: expect.stringMatching(
            new RegExp(`^workspace ${w.workspace_id} \\(brief\\) reaped: it expired at `),
          ),
        }),
      });
      expect(changed).toBeGreaterThanOrEqual(1);
      expect(fx.pyro.engine.events.listening).toBe(true);
    } finally {
      await fx.cleanup();
    }
    // A closed server no longer listens to the engine.
    expect(fx.pyro.engine.events.listening).toBe(false);
  });
});

describe("prompts per tool set", () => {
  it("offers a prompt only where its tools are, and names only tools of the set", () => {
    const names = (sel: Record<string, string>) => {
      const available = new Set(toolSet(sel).tools);
      return promptsFor(available).map((p) => p.name);
    };
    expect(names({ profile: "vm-run" })).toEqual([]);
    expect(names({ profile: "workspace-core" })).toEqual(["repro-fix", "inspect", "parallel-workspaces"]);
    expect(names({ mode: "repro-fix" })).toEqual(["repro-fix", "inspect", "parallel-workspaces"]);
    expect(names({ mode: "inspect" })).toEqual(["inspect"]);
    // Inspecting needs only reading and running: every mode with a workspace can do it.
    expect(names({ mode: "cold-start" })).toEqual(["inspect", "cold-start"]);
    expect(names({ mode: "review-eval" })).toEqual(["inspect", "review-eval"]);
    // Every prompt is offered by the mode it follows.
    for (const p of PROMPTS) expect(names({ mode: p.follows.mode })).toContain(p.name);

    for (const sel of [
      ...PROFILE_NAMES.map((profile) => ({ profile })),
      ...MODE_NAMES.map((mode) => ({ mode })),
    ]) {
      const available = new Set(toolSet(sel).tools);
      for (const p of promptsFor(available)) {
        const args = Object.fromEntries(p.arguments.map((a) => [a.name, a.required ? "x" : undefined]));
        const text = renderPrompt(p, args, available);
        const named = TOOL_NAMES.filter((t) => new RegExp(`\\b${t}\\b`).test(text));
        expect(named.length, `${p.name} in ${JSON.stringify(sel)}`).toBeGreaterThan(2);
        for (const t of named)
          expect(available.has(t), `${p.name} in ${JSON.stringify(sel)} names ${t}`).toBe(true);
      }
    }
  });

  it("inspect in its mode writes the report with exec (no file_write there)", () => {
    const available = new Set(toolSet({ mode: "inspect" }).tools);
    const p = PROMPTS.find((x) => x.name === "inspect");
    if (!p) throw new Error("no inspect prompt");
    const text = renderPrompt(p, {}, available);
    expect(text).toContain("REPORT.md with workspace_exec");
    expect(text).not.toContain("workspace_file_write");
  });
});
