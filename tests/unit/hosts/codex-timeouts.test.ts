import { mkdir, readFile, writeFile } from "node:fs/promises";
import { dirname } from "node:path";
import { parse as parseToml } from "smol-toml";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  CODEX_STARTUP_TIMEOUT_SEC,
  CODEX_TOOL_TIMEOUT_SEC,
  codex,
  codexConfigPath,
  EXEC_TIMEOUT_MAX_SECONDS,
} from "../../../src/hosts/codex.js";
import { printConfig } from "../../../src/hosts/index.js";
import { timeoutArg } from "../../../src/mcp/schemas.js";
import { FAKE_SERVER, fakeLaunch, type TempHome, tempHome } from "./helpers.js";

/**
 * Codex stops waiting for an MCP tool after `tool_timeout_sec` (60 s by default), so
 * pyro's table must allow the longest `workspace_exec` pyro accepts, with a margin.
 */
describe("Codex timeouts for pyro's entry", () => {
  let home: TempHome;
  let path: string;
  const table = async () => (parseToml(await readFile(path, "utf8")) as any).mcp_servers.pyro;

  beforeEach(async () => {
    home = await tempHome();
    path = codexConfigPath(home.ctx);
    await mkdir(dirname(path), { recursive: true });
  });
  afterEach(async () => {
    await home.cleanup();
  });

  it("the exec ceiling pyro plans for is the one the workspace_exec schema enforces", () => {
    expect(timeoutArg.safeParse(EXEC_TIMEOUT_MAX_SECONDS).success).toBe(true);
    expect(timeoutArg.safeParse(EXEC_TIMEOUT_MAX_SECONDS + 1).success).toBe(false);
    expect(CODEX_TOOL_TIMEOUT_SEC).toBeGreaterThan(EXEC_TIMEOUT_MAX_SECONDS);
  });

  it("connect writes tool_timeout_sec above the exec ceiling, and startup_timeout_sec", async () => {
    await codex.connect(home.ctx, fakeLaunch(), { verify: false });
    expect(await table()).toEqual({
      command: process.execPath,
      args: [FAKE_SERVER, "mcp", "serve"],
      tool_timeout_sec: CODEX_TOOL_TIMEOUT_SEC,
      startup_timeout_sec: CODEX_STARTUP_TIMEOUT_SEC,
    });
  });

  it("doctor calls an entry without tool_timeout_sec broken; repair and connect add it", async () => {
    // What pyro (or `codex mcp add`) wrote before: a launch and nothing else.
    const old = `model = "o3"\n\n[mcp_servers.pyro]\ncommand = "${process.execPath}"\nargs = ["${FAKE_SERVER}", "mcp", "serve"]\n`;
    await writeFile(path, old);
    const before = await codex.check(home.ctx, { probe: false });
    expect(before.status).toBe("broken");
    expect(before.problems).toEqual([
      `tool_timeout_sec is not set (Codex's default is 60 s): Codex would give up on a workspace_exec that may run 86400 s; pyro sets ${CODEX_TOOL_TIMEOUT_SEC}`,
    ]);
    expect(before.fix).toBe("pyro host repair codex");

    const r = await codex.repair(home.ctx, { launch: fakeLaunch });
    expect(r.action).toBe("repaired");
    expect(r.after.status).toBe("ok");
    expect((await table()).tool_timeout_sec).toBe(CODEX_TOOL_TIMEOUT_SEC);

    await writeFile(path, old);
    const c = await codex.connect(home.ctx, fakeLaunch(), { verify: false });
    expect(c.action).toBe("updated");
    expect((await table()).tool_timeout_sec).toBe(CODEX_TOOL_TIMEOUT_SEC);
  });

  it("a tool_timeout_sec below the ceiling is raised; a user's longer ones are kept", async () => {
    await codex.connect(home.ctx, fakeLaunch(), { verify: false });
    const text = await readFile(path, "utf8");
    await writeFile(path, text.replace(/tool_timeout_sec = \d+/, "tool_timeout_sec = 600"));
    expect((await codex.check(home.ctx, { probe: false })).problems[0]).toMatch(/^tool_timeout_sec is 600: /);
    expect((await codex.repair(home.ctx, { launch: fakeLaunch })).after.status).toBe("ok");
    expect((await table()).tool_timeout_sec).toBe(CODEX_TOOL_TIMEOUT_SEC);

    const longer = (await readFile(path, "utf8"))
      .replace(/tool_timeout_sec = \d+/, "tool_timeout_sec = 200000")
      .replace(/startup_timeout_sec = \d+/, "startup_timeout_sec = 120");
    await writeFile(path, longer);
    expect((await codex.check(home.ctx, { probe: false })).status).toBe("ok");
    expect((await codex.connect(home.ctx, fakeLaunch(), { verify: false })).action).toBe("unchanged");
    expect(await readFile(path, "utf8")).toBe(longer);
  });

  it("print-config's snippet carries the timeouts, and offers no `codex mcp add` line (it cannot set them)", () => {
    const p = printConfig("codex", fakeLaunch());
    expect((parseToml(p.snippet) as any).mcp_servers.pyro).toMatchObject({
      tool_timeout_sec: CODEX_TOOL_TIMEOUT_SEC,
      startup_timeout_sec: CODEX_STARTUP_TIMEOUT_SEC,
    });
    expect(p.cli_command).toBeNull();
  });
});
