import { mkdir } from "node:fs/promises";
import { parse } from "smol-toml";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PYRO_BIN } from "../../helpers/cli.js";
import { type HostHome, hostHome, realHostSkipReason } from "../../helpers/hosts.js";
import { suiteTitle } from "../../helpers/sandbox.js";

/**
 * The real Codex CLI in a throwaway HOME: pyro edits its own table (`codex mcp add`
 * drops comments and cannot set timeouts) and Codex reads it back; `codex mcp list`
 * must show pyro enabled (Codex does not launch servers to list them, so pyro's own
 * doctor is what proves it starts).
 */
const skip = await realHostSkipReason("codex");

const SEED = `# my codex config
model = "o3"   # keep me

# servers I use
[mcp_servers.other]
# echo, for testing
command = "/bin/echo"   # trailing comment
args = ["hi"]

# reviews
[profiles.review]
model = "gpt-5" # inline comment

# end of file
`;

describe.skipIf(skip !== "")(suiteTitle("Codex, for real", skip), () => {
  let h: HostHome;
  const CONFIG = ".codex/config.toml";
  const listed = (name: string) => {
    const r = h.host("codex", ["mcp", "list", "--json"]);
    expect(r.code, r.stderr).toBe(0);
    return (r.json() as any[]).find((s) => s.name === name);
  };
  const expectSeedIntact = async () => {
    const text = await h.read(CONFIG);
    // Every line of the seed, comments included, is still there, in order.
    const lines = text.split("\n");
    let at = 0;
    for (const line of SEED.split("\n")) {
      at = lines.indexOf(line, at);
      expect(at, line).toBeGreaterThanOrEqual(0);
    }
    const doc = parse(text) as any;
    expect(doc.mcp_servers.other).toEqual({ command: "/bin/echo", args: ["hi"] });
    expect(doc.profiles).toEqual({ review: { model: "gpt-5" } });
  };

  beforeAll(async () => {
    h = await hostHome();
    await mkdir(`${h.home}/.codex`);
    await h.write(CONFIG, SEED);
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("connect adds pyro with its timeouts, `codex mcp list` shows it enabled, and every comment stays", async () => {
    const r = h.pyro(["host", "connect", "codex", "--json"]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.json()).toMatchObject({ host: "codex", action: "added", method: "file", starts: true });
    const got = h.host("codex", ["mcp", "get", "pyro", "--json"]).json();
    expect(got).toMatchObject({ tool_timeout_sec: 87000, startup_timeout_sec: 30 });
    const pyro = listed("pyro");
    expect(pyro).toMatchObject({ enabled: true, transport: { type: "stdio", command: process.execPath } });
    expect(pyro.transport.args).toEqual([PYRO_BIN, "mcp", "serve"]);
    const table = h.host("codex", ["mcp", "list"]);
    expect(table.stdout).toMatch(/^pyro\s.*\senabled\s/m);
    await expectSeedIntact();
  });

  it("a second connect changes nothing, byte for byte", async () => {
    const before = await h.read(CONFIG);
    const r = h.pyro(["host", "connect", "codex", "--json", "--no-verify"]);
    expect(r.json().action).toBe("unchanged");
    expect(await h.read(CONFIG)).toBe(before);
  });

  it("host doctor notices a disabled entry (codex lists it disabled), and host repair re-enables it", async () => {
    const text = await h.read(CONFIG);
    await h.write(CONFIG, text.replace("[mcp_servers.pyro]\n", "[mcp_servers.pyro]\nenabled = false\n"));
    expect(listed("pyro").enabled).toBe(false);

    const d = h.pyro(["host", "doctor", "codex", "--json"]).json().hosts[0];
    expect(d).toMatchObject({ installed: true, configured: true, status: "broken" });
    expect(d.problems).toContain("the entry is disabled");

    const r = h.pyro(["host", "repair", "codex", "--json"]);
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(r.json()).toMatchObject({ action: "repaired", after: { status: "ok", starts: true } });
    expect(listed("pyro").enabled).toBe(true);
    await expectSeedIntact();
  });

  it("host doctor notices an entry whose pyro is gone, and host repair fixes it", async () => {
    await h.write(CONFIG, (await h.read(CONFIG)).replace(PYRO_BIN, "/nonexistent/bin/pyro.js"));
    const d = h.pyro(["host", "doctor", "codex", "--json"]).json().hosts[0];
    expect(d.status).toBe("broken");
    expect(d.problems.join(" ")).toMatch(/nonexistent/);
    const r = h.pyro(["host", "repair", "codex", "--json"]);
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(r.json().after.status).toBe("ok");
    expect(listed("pyro").transport.args).toEqual([PYRO_BIN, "mcp", "serve"]);
    await expectSeedIntact();
  });

  it("host doctor calls an entry without tool_timeout_sec broken (Codex would cut a long exec at 60 s); repair adds it", async () => {
    const text = await h.read(CONFIG);
    await h.write(CONFIG, text.replace(/^tool_timeout_sec = .*\n/m, ""));
    expect(h.host("codex", ["mcp", "get", "pyro", "--json"]).json().tool_timeout_sec).toBeNull();
    const d = h.pyro(["host", "doctor", "codex", "--no-start", "--json"]).json().hosts[0];
    expect(d.status).toBe("broken");
    expect(d.problems.join(" ")).toMatch(/^tool_timeout_sec is not set/);
    const r = h.pyro(["host", "repair", "codex", "--json"]);
    expect(r.json().after.status).toBe("ok");
    expect(h.host("codex", ["mcp", "get", "pyro", "--json"]).json().tool_timeout_sec).toBe(87000);
    await expectSeedIntact();
  });

  it("a config Codex rejects is put back as it was, and connect says what Codex said, without a backtrace", async () => {
    const good = await h.read(CONFIG);
    // Valid TOML, wrong type for Codex: Codex refuses to load the whole file.
    const bad = good.replace("[profiles.review]\n", "[profiles.review]\nmodel_reasoning_effort = 7\n");
    await h.write(CONFIG, bad.replace(/^tool_timeout_sec = .*\n/m, ""));
    const before = await h.read(CONFIG);
    const r = h.pyro(["host", "connect", "codex", "--no-verify"]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(
      /^pyro: error \[conflict\]: Codex does not accept .*config\.toml with pyro's entry/,
    );
    expect(r.stderr).toContain("profiles.review.model_reasoning_effort");
    expect(r.stderr).not.toMatch(/backtrace|<unknown>|\n\s+at /i);
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
    expect(await h.read(CONFIG)).toBe(before);
    await h.write(CONFIG, good);
  });

  it("disconnect removes pyro's table (`codex mcp list` no longer has it), keeps the rest, and is idempotent", async () => {
    const r = h.pyro(["host", "disconnect", "codex", "--json"]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.json()).toMatchObject({ host: "codex", changed: true, method: "file" });
    expect(listed("pyro")).toBeUndefined();
    expect(listed("other")).toBeDefined();
    await expectSeedIntact();
    expect(await h.read(CONFIG)).not.toContain("[mcp_servers.pyro]");
    const again = h.pyro(["host", "disconnect", "codex", "--json"]);
    expect(again.json()).toMatchObject({ changed: false, method: "none" });
  });
});
