import { type ChildProcess, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pyro as cli, PYRO_BIN, REPO_ROOT } from "../../helpers/cli.js";
import { bwrapSkipReason, ENV_CACHE, exited } from "../../helpers/sandbox.js";

/**
 * `pyro mcp serve --http 127.0.0.1:0`: the built CLI as a separate process, a free port
 * chosen by the kernel and announced on stderr, an MCP client over Streamable HTTP.
 * Listing and workspace_list need no sandbox; vm_run needs bwrap.
 */
const sandboxSkip = bwrapSkipReason();

describe("pyro mcp serve --http on loopback", () => {
  let home: string;
  let child: ChildProcess;
  let url: string;
  let stderr = "";

  beforeAll(async () => {
    if (!existsSync(join(REPO_ROOT, "dist", "cli", "main.js")))
      throw new Error("run `npm run build` before the integration tests");
    home = await mkdtemp(join(tmpdir(), "pyro-it-mcp-http-"));
    child = spawn(
      process.execPath,
      [PYRO_BIN, "mcp", "serve", "--http", "127.0.0.1:0", "--mode", "inspect"],
      {
        cwd: home,
        env: {
          ...process.env,
          PYRO_HOME: home,
          PYRO_ENV_CACHE: ENV_CACHE || join(home, "envs"),
          PYRO_DEBUG: "",
        },
        stdio: ["ignore", "ignore", "pipe"],
      },
    );
    url = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no URL announced; stderr: ${stderr}`)), 30_000);
      child.stderr?.on("data", (c: Buffer) => {
        stderr += c.toString("utf8");
        const m = /at (http:\/\/127\.0\.0\.1:\d+\/mcp)/.exec(stderr);
        if (m) {
          clearTimeout(timer);
          resolve(m[1]!);
        }
      });
      child.once("exit", (code) => reject(new Error(`server exited with ${code}: ${stderr}`)));
    });
  });
  afterAll(async () => {
    if (child && child.exitCode === null) child.kill("SIGKILL");
    await rm(home, { recursive: true, force: true });
  });

  const connect = async () => {
    const client = new Client({ name: "pyro-http-it", version: "0" });
    await client.connect(new StreamableHTTPClientTransport(new URL(url)));
    return client;
  };

  it("announces the endpoint and serves the selected mode's tools", async () => {
    expect(stderr).toContain("mode inspect (9 tools)");
    const client = await connect();
    try {
      const tools = (await client.listTools()).tools.map((t) => t.name);
      expect(tools).toHaveLength(9);
      expect(tools).not.toContain("workspace_patch_apply");
      const list = await client.callTool({ name: "workspace_list", arguments: {} });
      expect(list).toMatchObject({ structuredContent: { count: 0, workspaces: [] } });
      const bad = await client.callTool({ name: "workspace_exec", arguments: { workspace_id: 7 } });
      expect(bad).toMatchObject({
        isError: true,
        structuredContent: { error: { code: "invalid_argument" } },
      });
    } finally {
      await client.close();
    }
  });

  it.skipIf(sandboxSkip !== "")(
    `runs vm_run in a sandbox over HTTP${sandboxSkip ? ` (skipped: ${sandboxSkip})` : ""}`,
    async () => {
      // vm_run is not in the inspect mode: this needs a server with the vm-run profile.
      const other = spawn(
        process.execPath,
        [PYRO_BIN, "mcp", "serve", "--http", "127.0.0.1:0", "--profile", "vm-run"],
        {
          cwd: home,
          env: { ...process.env, PYRO_HOME: home, PYRO_ENV_CACHE: ENV_CACHE, PYRO_DEBUG: "" },
          stdio: ["ignore", "ignore", "pipe"],
        },
      );
      try {
        let err = "";
        const endpoint = await new Promise<string>((resolve, reject) => {
          other.stderr?.on("data", (c: Buffer) => {
            err += c.toString("utf8");
            const m = /at (http:\/\/127\.0\.0\.1:\d+\/mcp)/.exec(err);
            if (m) resolve(m[1]!);
          });
          other.once("exit", (code) => reject(new Error(`exited ${code}: ${err}`)));
        });
        const client = new Client({ name: "pyro-http-it", version: "0" });
        await client.connect(new StreamableHTTPClientTransport(new URL(endpoint)));
        const r = await client.callTool({
          name: "vm_run",
          arguments: { command: "echo hi; cat /etc/debian_version", backend: "bwrap" },
        });
        expect(r.isError).toBeFalsy();
        expect(r.structuredContent).toMatchObject({
          exit_code: 0,
          backend: "bwrap",
          execution_mode: "guest_agent",
        });
        expect((r.structuredContent as { stdout: string }).stdout).toMatch(/^hi\n12\./);
        await client.close();
      } finally {
        other.kill("SIGTERM");
        await exited(other);
      }
    },
  );

  it("exits cleanly on SIGTERM", async () => {
    child.kill("SIGTERM");
    expect(await exited(child)).toBe(0);
  });
});

describe("pyro mcp serve usage errors", () => {
  it("refuses a non-loopback --http address, an unknown profile and contradictory flags with one line", () => {
    for (const args of [
      ["--http", "0.0.0.0:0"],
      ["--profile", "nope"],
      ["--mode", "inspect", "--profile", "vm-run"],
      ["--repo-ref", "main"],
    ]) {
      const r = cli(["mcp", "serve", ...args], { PYRO_HOME: join(tmpdir(), "pyro-it-never-created") });
      expect(r.code, args.join(" ")).toBe(1);
      expect(r.stderr).toMatch(/^pyro: error \[invalid_argument\]: .+\n$/);
      expect(r.stdout).toBe("");
    }
  });
});
