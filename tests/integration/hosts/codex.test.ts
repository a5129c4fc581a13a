import { mkdir } from "node:fs/promises";
import { parse } from "smol-toml";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PYRO_BIN } from "../../helpers/cli.js";
import { type HostHome, hostHome, realHostSkipReason } from "../../helpers/hosts.js";
import { suiteTitle } from "../../helpers/sandbox.js";

/**
 * The real Codex CLI in a throwaway HOME: connect goes through `codex mcp add`;
 * `codex mcp list` must show pyro enabled (Codex does not launch servers to list them,
 * so pyro's own doctor is what proves it starts).
 */
const skip = await realHostSkipReason("codex");

const SEED = `# my codex config
model = "o3"   # keep me

[mcp_servers.other]
command = "/bin/echo"
args = ["hi"]

[profiles.review]
model = "gpt-5"
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
    expect(text).toContain('# my codex config\nmodel = "o3"   # keep me');
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

  it("connect adds pyro with `codex mcp add`, and `codex mcp list` shows it enabled", async () => {
    const r = h.pyro(["host", "connect", "codex", "--json"]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.json()).toMatchObject({ host: "codex", action: "added", method: "cli", starts: true });
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
});
