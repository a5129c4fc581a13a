import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PYRO_BIN } from "../../helpers/cli.js";
import { type HostHome, hostHome, listLine, realHostSkipReason } from "../../helpers/hosts.js";
import { suiteTitle } from "../../helpers/sandbox.js";

/**
 * The real OpenCode CLI in a throwaway HOME: OpenCode has no non-interactive `mcp add`,
 * so pyro writes `opencode.json`; `opencode mcp list` (which connects to each server)
 * is the judge.
 */
const skip = await realHostSkipReason("opencode");

describe.skipIf(skip !== "")(suiteTitle("OpenCode, for real", skip), () => {
  let h: HostHome;
  const CONFIG = ".config/opencode/opencode.json";
  const mcpList = () => {
    const r = h.host("opencode", ["mcp", "list"]);
    expect(r.code, r.stderr).toBe(0);
    return r.plain;
  };
  const expectSeedIntact = async () => {
    const doc = JSON.parse(await h.read(CONFIG));
    expect(doc.autoupdate).toBe(false);
    expect(doc.mcp.other).toEqual({ type: "local", command: ["/bin/echo", "hi"], enabled: false });
  };

  beforeAll(async () => {
    h = await hostHome();
    await mkdir(join(h.home, ".config", "opencode"), { recursive: true });
    await h.write(
      CONFIG,
      JSON.stringify(
        {
          $schema: "https://opencode.ai/config.json",
          autoupdate: false,
          mcp: { other: { type: "local", command: ["/bin/echo", "hi"], enabled: false } },
        },
        null,
        2,
      ),
    );
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("connect writes opencode.json, and `opencode mcp list` reports pyro connected", async () => {
    const r = h.pyro(["host", "connect", "opencode", "--json"]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.json()).toMatchObject({ host: "opencode", action: "added", method: "file", starts: true });
    const list = mcpList();
    expect(listLine(list, "pyro")).toMatch(/connected/);
    expect(listLine(list, "other")).toMatch(/disabled/);
    await expectSeedIntact();
  });

  it("a second connect changes nothing, byte for byte", async () => {
    const before = await h.read(CONFIG);
    expect(h.pyro(["host", "connect", "opencode", "--json", "--no-verify"]).json().action).toBe("unchanged");
    expect(await h.read(CONFIG)).toBe(before);
  });

  it("host doctor notices a broken entry (opencode fails to connect), and host repair fixes it", async () => {
    const doc = JSON.parse(await h.read(CONFIG));
    doc.mcp.pyro.command[1] = "/nonexistent/bin/pyro.js";
    await h.write(CONFIG, JSON.stringify(doc, null, 2));
    expect(listLine(mcpList(), "pyro")).toMatch(/failed/);

    const d = h.pyro(["host", "doctor", "opencode", "--json"]).json().hosts[0];
    expect(d).toMatchObject({ installed: true, configured: true, status: "broken" });

    const r = h.pyro(["host", "repair", "opencode", "--json"]);
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(r.json()).toMatchObject({ action: "repaired", after: { status: "ok", starts: true } });
    expect(JSON.parse(await h.read(CONFIG)).mcp.pyro.command).toEqual([
      process.execPath,
      PYRO_BIN,
      "mcp",
      "serve",
    ]);
    expect(listLine(mcpList(), "pyro")).toMatch(/connected/);
    await expectSeedIntact();
  });

  it("host doctor notices a disabled entry, and host repair switches it back on", async () => {
    const doc = JSON.parse(await h.read(CONFIG));
    doc.mcp.pyro.enabled = false;
    await h.write(CONFIG, JSON.stringify(doc, null, 2));
    expect(listLine(mcpList(), "pyro")).toMatch(/disabled/);
    expect(h.pyro(["host", "doctor", "opencode", "--json"]).json().hosts[0].problems).toContain(
      "the entry is disabled",
    );
    const r = h.pyro(["host", "repair", "opencode", "--json"]);
    expect(r.json().after.status).toBe("ok");
    expect(listLine(mcpList(), "pyro")).toMatch(/connected/);
    await expectSeedIntact();
  });

  it("disconnect removes pyro (`opencode mcp list` no longer has it), keeps the rest, and is idempotent", async () => {
    const r = h.pyro(["host", "disconnect", "opencode", "--json"]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.json()).toMatchObject({ host: "opencode", changed: true, method: "file" });
    const list = mcpList();
    expect(listLine(list, "pyro")).toBe("");
    expect(listLine(list, "other")).toMatch(/disabled/);
    await expectSeedIntact();
    expect(h.pyro(["host", "disconnect", "opencode", "--json"]).json().changed).toBe(false);
  });
});

/** OpenCode reads comments and trailing commas in opencode.json and opencode.jsonc; so does pyro. */
describe.skipIf(skip !== "")(suiteTitle("OpenCode with a commented config, for real", skip), () => {
  let h: HostHome;
  const SEED = `{
  // my OpenCode config
  "$schema": "https://opencode.ai/config.json",
  "autoupdate": false, // no surprises
  "mcp": {
    /* someone else's server */
    "other": { "type": "local", "command": ["/bin/echo", "hi"], "enabled": false },
  },
}
`;
  beforeAll(async () => {
    h = await hostHome();
    await mkdir(join(h.home, ".config", "opencode"), { recursive: true });
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it.each(["opencode.json", "opencode.jsonc"])(
    "connect edits %s in place, opencode reports pyro connected, and disconnect gives the file back byte for byte",
    async (name) => {
      const config = `.config/opencode/${name}`;
      await h.write(config, SEED);
      const r = h.pyro(["host", "connect", "opencode", "--json"]);
      expect(r.code, r.stderr).toBe(0);
      expect(r.json()).toMatchObject({ action: "added", config_path: join(h.home, config), starts: true });
      const text = await h.read(config);
      for (const comment of ["// my OpenCode config", "// no surprises", "/* someone else's server */"])
        expect(text).toContain(comment);
      const list = h.host("opencode", ["mcp", "list"]);
      expect(list.code, list.stderr).toBe(0);
      expect(listLine(list.plain, "pyro")).toMatch(/connected/);
      expect(listLine(list.plain, "other")).toMatch(/disabled/);

      expect(h.pyro(["host", "disconnect", "opencode", "--json"]).json().changed).toBe(true);
      expect(await h.read(config)).toBe(SEED);
      await rm(join(h.home, config));
    },
  );
});
