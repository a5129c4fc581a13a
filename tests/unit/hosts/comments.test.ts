import { chmod, mkdir, readFile, stat, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { codex, codexConfigPath } from "../../../src/hosts/codex.js";
import { tomlTable } from "../../../src/hosts/files.js";
import type { HostContext } from "../../../src/hosts/host.js";
import { parseJsonc } from "../../../src/hosts/jsonc.js";
import { opencode, opencodeConfigDir } from "../../../src/hosts/opencode.js";
import { FAKE_SERVER, fakeLaunch, type TempHome, tempHome } from "./helpers.js";

/** Everything a user wrote around pyro's table, comments in every place they go. */
const HEAD = `# top: my codex config
model = "o3"   # keep me

# the servers
[mcp_servers.other]
# inside other
command = "/bin/echo"   # trailing
args = ["hi"]

# before pyro
`;
const OLD_PYRO = `[mcp_servers.pyro]
command = "/old/node"
args = ["/old/pyro.js", "mcp", "serve"]
`;
const TAIL = `
# after pyro, before profiles
[profiles.review]
model = "gpt-5" # inline

# end of file
`;

/**
 * A stand-in `codex` CLI: `mcp add` rewrites config.toml without its comments (as the
 * real one does with the tables it touches), `mcp get pyro --json` reads the entry back,
 * or fails as Codex does on a config it rejects (`reject-me` in the file). Every call is
 * logged.
 */
async function fakeCodex(dir: string): Promise<string> {
  const bin = join(dir, "fake-codex");
  await writeFile(
    bin,
    `#!${process.execPath}
const fs = require("node:fs");
const args = process.argv.slice(2);
const config = (process.env.CODEX_HOME || process.env.HOME + "/.codex") + "/config.toml";
fs.appendFileSync(process.env.HOME + "/codex.log", args.join(" ") + "\\n");
const text = fs.existsSync(config) ? fs.readFileSync(config, "utf8") : "";
if (args[0] === "--version") console.log("codex-cli 0.0.0-fake");
else if (args[0] === "mcp" && args[1] === "add") {
  fs.writeFileSync(config, text.split("\\n").filter((l) => !l.trim().startsWith("#")).join("\\n"));
} else if (args[0] === "mcp" && args[1] === "get") {
  if (text.includes("reject-me")) {
    console.error("WARNING: proceeding, even though we could not create PATH aliases");
    console.error("Error: failed to load bootstrap configuration\\n\\nCaused by:\\n    invalid type: string \\"reject-me\\", expected f64\\n\\nStack backtrace:\\n   0: <unknown>");
    process.exit(1);
  }
  if (!text.includes("[mcp_servers.pyro]")) { console.error("Error: No MCP server named 'pyro' found."); process.exit(1); }
  console.log(JSON.stringify({ name: "pyro", enabled: true, transport: { type: "stdio", command: "node", args: [] } }));
}
`,
  );
  await chmod(bin, 0o755);
  return bin;
}

describe("Codex: pyro's table is the only thing that changes", () => {
  let home: TempHome;
  let ctx: HostContext;
  let path: string;
  const text = () => readFile(path, "utf8");
  const log = async () => (await readFile(join(home.dir, "codex.log"), "utf8")).trim().split("\n");

  beforeEach(async () => {
    home = await tempHome();
    ctx = { ...home.ctx, env: { ...home.ctx.env, PYRO_CODEX_BIN: await fakeCodex(home.dir) } };
    path = codexConfigPath(ctx);
    await mkdir(dirname(path), { recursive: true });
    await writeFile(path, HEAD + OLD_PYRO + TAIL);
  });
  afterEach(async () => {
    await home.cleanup();
  });

  it("with the codex CLI installed, connect keeps every comment above, inside and after other tables", async () => {
    const r = await codex.connect(ctx, fakeLaunch(), { verify: false });
    expect(r).toMatchObject({ action: "updated", method: "file" });
    const table = tomlTable(["mcp_servers", "pyro"], {
      command: process.execPath,
      args: [FAKE_SERVER, "mcp", "serve"],
      tool_timeout_sec: 87_000,
      startup_timeout_sec: 30,
    });
    expect(await text()).toBe(HEAD + table + TAIL);
    // Codex read the entry back; it never rewrote the file itself.
    expect(await log()).toEqual(["mcp get pyro --json"]);
  });

  it("repair keeps them too", async () => {
    const r = await codex.repair(ctx, { launch: fakeLaunch });
    expect(r.action).toBe("repaired");
    const out = await text();
    expect(out.startsWith(HEAD)).toBe(true);
    expect(out.endsWith(TAIL)).toBe(true);
    expect(out).not.toContain("/old/");
  });

  it("disconnect removes pyro's table and keeps every other line", async () => {
    const r = await codex.disconnect(ctx);
    expect(r).toMatchObject({ changed: true, method: "file" });
    expect(await text()).toBe(HEAD + TAIL);
    expect((await codex.disconnect(ctx)).changed).toBe(false);
    expect(await text()).toBe(HEAD + TAIL);
  });

  it("when Codex refuses the edited config, the file goes back byte for byte and connect fails with Codex's words", async () => {
    const seed = `${HEAD}[mcp_servers.broken]\ncommand = "x"\nstartup_timeout_sec = "reject-me"\n${TAIL}`;
    await writeFile(path, seed);
    const err = await codex.connect(ctx, fakeLaunch(), { verify: false }).catch((e) => e);
    expect(err).toMatchObject({ code: "conflict" });
    expect(err.message).toBe(
      `Codex does not accept ${path} with pyro's entry (failed to load bootstrap configuration / invalid type: string "reject-me", expected f64); the file is back as it was`,
    );
    expect(err.message).not.toMatch(/backtrace|WARNING/);
    expect(await text()).toBe(seed);
  });

  it("when Codex refuses a config pyro created, the file is removed again", async () => {
    const bad = { ...ctx, env: { ...ctx.env, CODEX_HOME: join(home.dir, "fresh") } };
    await mkdir(join(home.dir, "fresh"));
    const launch = { ...fakeLaunch(), args: [FAKE_SERVER, "reject-me"] };
    await expect(codex.connect(bad, launch, { verify: false })).rejects.toMatchObject({ code: "conflict" });
    await expect(stat(codexConfigPath(bad))).rejects.toMatchObject({ code: "ENOENT" });
  });
});

describe("OpenCode: JSONC configs keep their comments", () => {
  let home: TempHome;
  let dir: string;
  const SEED = `{
  // my OpenCode config
  "$schema": "https://opencode.ai/config.json",
  "autoupdate": false, // no surprises
  "mcp": {
    /* someone else's server */
    "other": {
      "type": "local",
      "command": ["/bin/echo", "hi"],
      "enabled": false, // for now
    },
  },
}
`;
  beforeEach(async () => {
    home = await tempHome();
    dir = opencodeConfigDir(home.ctx);
    await mkdir(dir, { recursive: true });
  });
  afterEach(async () => {
    await home.cleanup();
  });
  const read = (name: string) => readFile(join(dir, name), "utf8");

  it("connects to an opencode.json with comments and trailing commas (once refused as conflict)", async () => {
    await writeFile(join(dir, "opencode.json"), SEED);
    const r = await opencode.connect(home.ctx, fakeLaunch());
    expect(r).toMatchObject({ action: "added", method: "file", starts: true });
    const out = await read("opencode.json");
    // Every line of the seed is still there, in order; pyro's entry is the only addition.
    const lines = out.split("\n");
    let at = 0;
    for (const line of SEED.split("\n")) {
      at = lines.indexOf(line, at);
      expect(at, line).toBeGreaterThanOrEqual(0);
    }
    const doc = parseJsonc(out).data as any;
    expect(doc.mcp.other).toEqual({ type: "local", command: ["/bin/echo", "hi"], enabled: false });
    expect(doc.mcp.pyro.command).toEqual([process.execPath, FAKE_SERVER, "mcp", "serve"]);
    expect((await opencode.check(home.ctx)).status).toBe("ok");

    expect((await opencode.connect(home.ctx, fakeLaunch(), { verify: false })).action).toBe("unchanged");
    expect(await read("opencode.json")).toBe(out);
    expect((await opencode.disconnect(home.ctx)).changed).toBe(true);
    expect(await read("opencode.json")).toBe(SEED);
  });

  it("uses opencode.jsonc when that is the only config, and creates no opencode.json", async () => {
    await writeFile(join(dir, "opencode.jsonc"), SEED);
    const r = await opencode.connect(home.ctx, fakeLaunch(), { verify: false });
    expect(r.config_path).toBe(join(dir, "opencode.jsonc"));
    expect((parseJsonc(await read("opencode.jsonc")).data as any).mcp.pyro.type).toBe("local");
    await expect(stat(join(dir, "opencode.json"))).rejects.toMatchObject({ code: "ENOENT" });
    expect((await opencode.disconnect(home.ctx)).config_path).toBe(join(dir, "opencode.jsonc"));
    expect(await read("opencode.jsonc")).toBe(SEED);
  });

  it("reads the entry OpenCode uses when both files have one (opencode.jsonc wins), and disconnect removes both", async () => {
    const entry = (argv: string[]) => JSON.stringify({ mcp: { pyro: { type: "local", command: argv } } });
    await writeFile(join(dir, "opencode.json"), entry(["/from/json"]));
    await writeFile(join(dir, "opencode.jsonc"), entry([process.execPath, FAKE_SERVER, "mcp", "serve"]));
    const c = await opencode.check(home.ctx, { probe: false });
    expect(c.config_path).toBe(join(dir, "opencode.jsonc"));
    expect(c.command).toBe(process.execPath);
    expect(c.notes.join("\n")).toMatch(/opencode\.json holds a pyro entry too/);

    const r = await opencode.disconnect(home.ctx);
    expect(r.changed).toBe(true);
    for (const name of ["opencode.json", "opencode.jsonc"])
      expect(parseJsonc(await read(name)).data).toEqual({ mcp: {} });
  });

  it("a config that is not JSONC either is still refused, naming the line", async () => {
    await writeFile(join(dir, "opencode.json"), `{\n  "mcp": {\n    "other": 1\n    "more": 2\n  }\n}\n`);
    const c = await opencode.check(home.ctx, { probe: false });
    expect(c.problems[0]).toMatch(/^cannot parse .*opencode\.json: CommaExpected at line 4 column 5$/);
    await expect(opencode.connect(home.ctx, fakeLaunch())).rejects.toMatchObject({ code: "conflict" });
  });
});
