import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PYRO_BIN } from "../../helpers/cli.js";
import { type HostHome, hostHome, listLine, realHostSkipReason } from "../../helpers/hosts.js";
import { suiteTitle } from "../../helpers/sandbox.js";

/**
 * The real Claude Code CLI in a throwaway HOME: `pyro host connect` goes through
 * `claude mcp add`, and `claude mcp list` (which launches every server to health-check
 * it) is the judge.
 */
const skip = await realHostSkipReason("claude");

describe.skipIf(skip !== "")(suiteTitle("Claude Code, for real", skip), () => {
  let h: HostHome;
  const CONFIG = ".claude.json";
  const mcpList = () => {
    const r = h.host("claude", ["mcp", "list"]);
    expect(r.code, r.stderr).toBe(0);
    return r.plain;
  };

  beforeAll(async () => {
    h = await hostHome();
    // Someone else's server, which nothing pyro does may touch.
    const r = h.host("claude", ["mcp", "add", "other", "--scope", "user", "--", "/bin/echo", "hi"]);
    expect(r.code, r.stderr).toBe(0);
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("connect adds pyro with `claude mcp add`, and `claude mcp list` reports it connected", () => {
    const r = h.pyro(["host", "connect", "claude-code", "--json"]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.json()).toMatchObject({ host: "claude-code", action: "added", method: "cli", starts: true });
    expect(r.json().args).toEqual([PYRO_BIN, "mcp", "serve"]);
    const list = mcpList();
    expect(listLine(list, "pyro")).toMatch(/Connected/);
    expect(listLine(list, "other")).toContain("/bin/echo hi");
  });

  it("a second connect changes nothing", async () => {
    const before = JSON.parse(await h.read(CONFIG)).mcpServers;
    const r = h.pyro(["host", "connect", "claude-code", "--json", "--no-verify"]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.json().action).toBe("unchanged");
    expect(JSON.parse(await h.read(CONFIG)).mcpServers).toEqual(before);
  });

  it("host doctor reports it installed, configured and starting", () => {
    const r = h.pyro(["host", "doctor", "claude-code", "--json"]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.json().hosts[0]).toMatchObject({
      host: "claude-code",
      installed: true,
      configured: true,
      status: "ok",
      starts: true,
    });
  });

  it("host doctor notices a broken entry (as does claude), and host repair fixes it", async () => {
    const doc = JSON.parse(await h.read(CONFIG));
    doc.mcpServers.pyro.args[0] = "/nonexistent/bin/pyro.js";
    await h.write(CONFIG, JSON.stringify(doc, null, 2));
    expect(listLine(mcpList(), "pyro")).toMatch(/Failed/);

    const d = h.pyro(["host", "doctor", "claude-code", "--json"]);
    expect(d.json().hosts[0].status).toBe("broken");
    expect(d.json().hosts[0].problems.join(" ")).toMatch(/nonexistent/);

    const r = h.pyro(["host", "repair", "claude-code", "--json"]);
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(r.json()).toMatchObject({
      action: "repaired",
      before: { status: "broken" },
      after: { status: "ok", starts: true },
    });
    const list = mcpList();
    expect(listLine(list, "pyro")).toMatch(/Connected/);
    expect(listLine(list, "other")).toContain("/bin/echo hi");
  });

  it("host doctor notices a removed entry, and host repair puts it back", () => {
    expect(h.host("claude", ["mcp", "remove", "pyro", "--scope", "user"]).code).toBe(0);
    expect(h.pyro(["host", "doctor", "claude-code", "--json"]).json().hosts[0].status).toBe("missing");
    const r = h.pyro(["host", "repair", "claude-code", "--json"]);
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(r.json().after.status).toBe("ok");
    expect(listLine(mcpList(), "pyro")).toMatch(/Connected/);
  });

  it("disconnect removes pyro with `claude mcp remove`, keeps the other server, and is idempotent", () => {
    const r = h.pyro(["host", "disconnect", "claude-code", "--json"]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.json()).toMatchObject({ host: "claude-code", changed: true, method: "cli" });
    const list = mcpList();
    expect(listLine(list, "pyro")).toBe("");
    expect(listLine(list, "other")).toContain("/bin/echo hi");
    const again = h.pyro(["host", "disconnect", "claude-code", "--json"]);
    expect(again.code, again.stderr).toBe(0);
    expect(again.json()).toMatchObject({ changed: false, method: "none" });
  });
});
