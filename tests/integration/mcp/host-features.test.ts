import { spawn } from "node:child_process";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import {
  type CallToolResult,
  LoggingMessageNotificationSchema,
  ResourceListChangedNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MCP_RESULT_BYTES } from "../../../src/mcp/output.js";
import { PYRO_BIN } from "../../helpers/cli.js";
import { bwrapSkipReason, type Harness, openHarness, suiteTitle, writeTree } from "../../helpers/sandbox.js";
import { launchStdio, PYTHON_FIX, PYTHON_PROJECT } from "./helpers.js";

/**
 * What chat hosts use besides tools, against `pyro mcp serve` as a host launches it
 * (stdio) and over Streamable HTTP, on real bwrap workspaces: logging levels filter the
 * messages, prompts render with the profile's tools, resources read a workspace's real
 * diff, completions return matching names, and a 10 MB output stays under the bound.
 */
const skip = bwrapSkipReason();
const MARKER = /\[\.\.\. (\d+) bytes omitted \.\.\.\]/;
/** `seq 1 1400000`: 10,088,896 bytes. */
const SEQ_BYTES = 10_088_896;

interface Connected {
  client: Client;
  close(): Promise<void>;
}

async function connectHttp(cwd: string, env: NodeJS.ProcessEnv): Promise<Connected> {
  const child = spawn(
    process.execPath,
    [PYRO_BIN, "mcp", "serve", "--profile", "workspace-full", "--http", "127.0.0.1:0"],
    {
      cwd,
      env,
      stdio: ["ignore", "ignore", "pipe"],
    },
  );
  const url = await new Promise<string>((resolve, reject) => {
    let err = "";
    child.stderr.on("data", (c: Buffer) => {
      err += c.toString("utf8");
      const m = /at (http:\/\/127\.0\.0\.1:\d+\/mcp)/.exec(err);
      if (m?.[1]) resolve(m[1]);
    });
    child.once("exit", (code) => reject(new Error(`pyro mcp serve exited ${code}: ${err}`)));
  });
  const client = new Client({ name: "host-features-http", version: "0" });
  await client.connect(new StreamableHTTPClientTransport(new URL(url)));
  return {
    client,
    close: async () => {
      await client.close();
      child.kill("SIGTERM");
      await new Promise((r) => child.once("exit", r));
    },
  };
}

describe.each(["stdio", "http"] as const)("MCP host features over %s", (transport) => {
  describe.skipIf(skip !== "")(suiteTitle(`pyro mcp serve (${transport}) on bwrap`, skip), () => {
    let h: Harness;
    let project: string;
    let c: Connected;
    const logs: { level: string; data: { message: string; kind: string } }[] = [];
    let listChanged = 0;
    const ok = async (name: string, args: Record<string, unknown> = {}) => {
      const r = (await c.client.callTool({ name, arguments: args })) as CallToolResult;
      if (r.isError) throw new Error(`${name}: ${JSON.stringify(r.structuredContent)}`);
      return r;
    };
    const settle = async (until: () => boolean) => {
      for (let i = 0; i < 100 && !until(); i++) await new Promise((r) => setTimeout(r, 20));
    };

    beforeAll(async () => {
      h = await openHarness(`mcp-host-${transport}`);
      project = await h.tempDir("project");
      await writeTree(project, PYTHON_PROJECT);
      const env = { ...process.env, ...h.cliEnv, PYRO_BACKEND: "bwrap", PYRO_DEBUG: "" };
      if (transport === "stdio") {
        const s = await launchStdio({ cwd: project, env, args: ["--profile", "workspace-full"] });
        c = { client: s.client, close: () => s.close() };
      } else {
        c = await connectHttp(project, env);
      }
      c.client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
        logs.push(n.params as (typeof logs)[number]);
      });
      c.client.setNotificationHandler(ResourceListChangedNotificationSchema, () => {
        listChanged += 1;
      });
      // The client checks structuredContent against the schemas once it has listed them.
      await c.client.listTools();
    });
    afterAll(async () => {
      await c?.close();
      await h?.cleanup();
    });

    it("filters log messages by the level set", async () => {
      await c.client.setLoggingLevel("warning");
      logs.length = 0;
      await ok("workspace_create", { name: `quiet-${transport}`, seed_path: "." });
      const refused = await c.client.callTool({
        name: "workspace_file_read",
        arguments: { workspace_id: `quiet-${transport}`, path: "/etc/passwd" },
      });
      expect(refused.isError).toBe(true);
      await settle(() => logs.length > 0);
      expect(logs.map((l) => l.level)).toEqual(["warning"]);
      expect(logs[0]?.data.message).toMatch(/^workspace_file_read refused: \[path_outside_workspace\]/);

      await c.client.setLoggingLevel("info");
      logs.length = 0;
      listChanged = 0;
      await ok("workspace_create", { name: `loud-${transport}`, seed_path: "." });
      await settle(() => logs.length > 0 && listChanged > 0);
      expect(logs).toContainEqual(
        expect.objectContaining({
          level: "notice",
          data: expect.objectContaining({
            kind: "workspace",
            message: expect.stringMatching(new RegExp(`\\(loud-${transport}\\) created: debian:12 on bwrap`)),
          }),
        }),
      );
      // A workspace came: hosts are told the resource list changed.
      expect(listChanged).toBeGreaterThanOrEqual(1);
    });

    it("renders prompts with the profile's tools", async () => {
      const { prompts } = await c.client.listPrompts();
      expect(prompts.map((p) => p.name)).toEqual([
        "repro-fix",
        "inspect",
        "cold-start",
        "review-eval",
        "parallel-workspaces",
      ]);
      const r = await c.client.getPrompt({
        name: "review-eval",
        arguments: { eval_command: "python3 -B test_calc.py" },
      });
      const text = String((r.messages[0]?.content as { text?: string } | undefined)?.text);
      expect(text).toContain("shell_open");
      expect(text).toContain("snapshot_create");
      expect(text).toContain("`python3 -B test_calc.py`");
    });

    it("reads a real workspace's diff as a resource", async () => {
      const w = (await ok("workspace_create", { name: `diff-${transport}`, seed_path: "." }))
        .structuredContent as {
        workspace_id: string;
      };
      await ok("workspace_patch_apply", { workspace_id: w.workspace_id, patch: PYTHON_FIX });
      const diff = await c.client.readResource({ uri: `pyro://workspaces/${w.workspace_id}/diff` });
      expect(diff.contents[0]).toMatchObject({ mimeType: "text/x-diff" });
      const patch = (diff.contents[0] as { text: string }).text;
      expect(patch).toContain("-    return a - b");
      expect(patch).toContain("+    return a + b");
      const file = await c.client.readResource({ uri: `pyro://workspaces/${w.workspace_id}/files/calc.py` });
      expect(file.contents[0]).toMatchObject({
        mimeType: "text/x-python",
        text: expect.stringContaining("a + b"),
      });
      const listed = await c.client.listResources();
      expect(listed.resources.map((r) => r.uri)).toContain(`pyro://workspaces/${w.workspace_id}/diff`);
    });

    it("completes workspace names, environments and paths", async () => {
      const complete = async (ref: any, name: string, value: string, context?: Record<string, string>) =>
        (
          await c.client.complete({
            ref,
            argument: { name, value },
            ...(context ? { context: { arguments: context } } : {}),
          })
        ).completion.values;
      expect(await complete({ type: "ref/prompt", name: "repro-fix" }, "workspace_id", "diff-")).toEqual([
        `diff-${transport}`,
      ]);
      expect(await complete({ type: "ref/prompt", name: "repro-fix" }, "environment", "debian:1")).toContain(
        "debian:12",
      );
      const files = { type: "ref/resource", uri: "pyro://workspaces/{workspace_id}/files/{+path}" };
      expect(await complete(files, "path", "ca", { workspace_id: `diff-${transport}` })).toEqual(["calc.py"]);
    });

    it("keeps a 10 MB output under the bound, head and tail kept around the marker", async () => {
      const r = (await c.client.callTool({
        name: "workspace_exec",
        arguments: { workspace_id: `diff-${transport}`, command: "seq 1 1400000" },
      })) as CallToolResult;
      expect(r.isError).toBeFalsy();
      expect(Buffer.byteLength(JSON.stringify(r))).toBeLessThan(MCP_RESULT_BYTES);
      const s = r.structuredContent as {
        stdout: string;
        stdout_bytes: number;
        truncated: boolean;
        seq: number;
      };
      expect(s).toMatchObject({ stdout_bytes: SEQ_BYTES, truncated: true });
      expect(s.stdout.startsWith("1\n2\n3\n")).toBe(true);
      expect(s.stdout.endsWith("1399999\n1400000\n")).toBe(true);
      expect(Number(MARKER.exec(s.stdout)?.[1])).toBeGreaterThan(SEQ_BYTES - 80_000);
      // The text a model reads: a rendering with the tail once and where the rest is.
      const text = (r.content[0] as { text: string }).text;
      expect(text.split("1399999\n1400000").length - 1).toBe(1);
      expect(text).toMatch(MARKER);
      expect(text).toContain(`workspace_logs with seq ${s.seq}`);
      // The kept output is readable through workspace_logs.
      const logs = await ok("workspace_logs", {
        workspace_id: `diff-${transport}`,
        seq: s.seq,
        max_output_bytes: 1024 * 1024,
      });
      const [cmd] = (logs.structuredContent as { commands: { stdout: string; stdout_bytes: number }[] })
        .commands;
      expect(cmd?.stdout_bytes).toBe(SEQ_BYTES);
      expect(cmd?.stdout.endsWith("1400000\n")).toBe(true);
      expect(Buffer.byteLength(cmd?.stdout ?? "")).toBeGreaterThan(1024 * 1024 - 100);
    });
  });
});
