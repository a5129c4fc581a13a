import { mkdir, writeFile } from "node:fs/promises";
import { dirname } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { codex, codexConfigPath } from "../../../src/hosts/codex.js";
import { opencode, opencodeConfigPath } from "../../../src/hosts/opencode.js";
import { FAKE_SERVER, type TempHome, tempHome } from "./helpers.js";

describe("doctor on an entry of the wrong transport", () => {
  let home: TempHome;
  beforeEach(async () => {
    home = await tempHome();
  });
  afterEach(async () => {
    await home.cleanup();
  });

  it("names OpenCode's remote entry plainly (once 'not a local local server')", async () => {
    const path = opencodeConfigPath(home.ctx);
    await mkdir(dirname(path), { recursive: true });
    const pyro = { type: "remote", command: [process.execPath, FAKE_SERVER, "mcp", "serve"] };
    await writeFile(path, JSON.stringify({ mcp: { pyro } }));
    const r = await opencode.check(home.ctx, { probe: false });
    expect(r.status).toBe("broken");
    expect(r.problems).toContain("the entry's type is 'remote', not 'local' (a server the host starts)");
    expect(r.problems.join("\n")).not.toMatch(/local local/);
  });

  it("names Codex's URL entry the same way", async () => {
    const path = codexConfigPath(home.ctx);
    await mkdir(dirname(path), { recursive: true });
    await writeFile(path, `[mcp_servers.pyro]\nurl = "http://127.0.0.1:1/mcp"\ntool_timeout_sec = 90000\n`);
    const r = await codex.check(home.ctx, { probe: false });
    expect(r.problems[0]).toBe("the entry's type is 'http', not 'stdio' (a server the host starts)");
  });
});
