import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PYRO_BIN, REPO_ROOT } from "../../helpers/cli.js";
import { bwrapSkipReason, ENV_CACHE } from "../../helpers/sandbox.js";
import { runProcess } from "./helpers.js";

/**
 * A third-party MCP client against the built server: the MCP Inspector's CLI
 * (@modelcontextprotocol/inspector-cli, a devDependency) in CLI mode over stdio.
 */
const INSPECTOR = join(
  REPO_ROOT,
  "node_modules",
  "@modelcontextprotocol",
  "inspector-cli",
  "build",
  "index.js",
);
const sandboxSkip = bwrapSkipReason();

describe("the MCP Inspector CLI against pyro mcp serve", () => {
  let root: string;
  let cwd: string;
  let env: NodeJS.ProcessEnv;

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "pyro-it-inspector-"));
    // inspector-cli 1.0.3 checks for its package.json as "../package.json" relative to the
    // process's cwd (then imports it relative to its own file), so it needs a cwd whose
    // parent holds some package.json. The server inherits this cwd: not a Git checkout.
    await writeFile(join(root, "package.json"), "{}\n");
    cwd = join(root, "run");
    await mkdir(cwd);
    env = {
      ...process.env,
      PYRO_HOME: join(root, "home"),
      PYRO_ENV_CACHE: ENV_CACHE || join(root, "envs"),
      PYRO_DEBUG: "",
    };
  });
  afterAll(async () => {
    await rm(root, { recursive: true, force: true });
  });

  const inspector = (...args: string[]) =>
    runProcess([process.execPath, INSPECTOR, process.execPath, PYRO_BIN, "mcp", "serve", ...args], {
      cwd,
      env,
      timeoutMs: 120_000,
    });

  it("lists the tools of the default profile", async () => {
    const r = await inspector("--method", "tools/list");
    expect(r.code, r.stderr).toBe(0);
    const { tools } = JSON.parse(r.stdout);
    expect(tools).toHaveLength(17);
    const exec = tools.find((t: { name: string }) => t.name === "workspace_exec");
    expect(exec.inputSchema.required).toEqual(["workspace_id", "command"]);
    expect(exec.outputSchema.properties).toHaveProperty("exit_code");
    expect(exec.annotations).toMatchObject({ readOnlyHint: false, destructiveHint: true });
  });

  it("calls workspace_list, and gets a structured error for an unknown workspace", async () => {
    const list = await inspector("--method", "tools/call", "--tool-name", "workspace_list");
    expect(list.code, list.stderr).toBe(0);
    expect(JSON.parse(list.stdout)).toMatchObject({ structuredContent: { count: 0, workspaces: [] } });
    const status = await inspector(
      "--method",
      "tools/call",
      "--tool-name",
      "workspace_status",
      "--tool-arg",
      "workspace_id=nope",
    );
    expect(JSON.parse(status.stdout)).toMatchObject({
      isError: true,
      structuredContent: { error: { code: "workspace_not_found" } },
    });
  });

  it("lists prompts, resources and resource templates, gets a prompt and sets the log level", async () => {
    const prompts = await inspector("--method", "prompts/list");
    expect(prompts.code, prompts.stderr).toBe(0);
    expect(JSON.parse(prompts.stdout).prompts.map((p: { name: string }) => p.name)).toEqual([
      "repro-fix",
      "inspect",
      "parallel-workspaces",
    ]);
    const got = await inspector(
      "--method",
      "prompts/get",
      "--prompt-name",
      "repro-fix",
      "--prompt-args",
      "command=npm test",
    );
    expect(got.code, got.stderr).toBe(0);
    expect(JSON.parse(got.stdout).messages[0].content.text).toContain("`npm test`");
    const resources = await inspector("--method", "resources/list");
    expect(JSON.parse(resources.stdout).resources).toEqual([
      expect.objectContaining({ uri: "pyro://workspaces", mimeType: "application/json" }),
    ]);
    const templates = await inspector("--method", "resources/templates/list");
    expect(JSON.parse(templates.stdout).resourceTemplates).toHaveLength(3);
    // The Inspector CLI takes its own names (trace, debug, info, warn, error) and sends them
    // as they are: only debug, info and error are MCP levels too.
    const level = await inspector("--method", "logging/setLevel", "--log-level", "error");
    expect(level.code, level.stderr).toBe(0);
  });

  it.skipIf(sandboxSkip !== "")(
    `calls vm_run in a real sandbox${sandboxSkip ? ` (skipped: ${sandboxSkip})` : ""}`,
    async () => {
      const r = await inspector(
        "--profile",
        "vm-run",
        "--method",
        "tools/call",
        "--tool-name",
        "vm_run",
        "--tool-arg",
        "command=echo from-inspector",
        "backend=bwrap",
      );
      expect(r.code, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout)).toMatchObject({
        structuredContent: { exit_code: 0, stdout: "from-inspector\n", backend: "bwrap" },
      });
    },
  );
});
