import { lstat, mkdir, readFile, rm, stat, symlink, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { parse as parseToml } from "smol-toml";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { claudeCode, claudeConfigPath } from "../../../src/hosts/claude-code.js";
import { codex, codexConfigPath } from "../../../src/hosts/codex.js";
import type { Host, HostContext } from "../../../src/hosts/host.js";
import { opencode, opencodeConfigPath } from "../../../src/hosts/opencode.js";
import { FAKE_SERVER, fakeLaunch, type TempHome, tempHome } from "./helpers.js";

/**
 * Each host's config, seeded with another server and an unrelated setting that connect
 * and repair must never touch. `servers` reads back the map of servers; `disable`
 * switches pyro's entry off the way the host's own config allows (null: no such flag).
 */
interface Case {
  host: Host;
  path: (ctx: HostContext) => string;
  seed: string;
  servers: (text: string) => Record<string, unknown>;
  unrelated: (text: string) => unknown;
  disable: ((text: string) => string) | null;
}

const cases: Case[] = [
  {
    host: claudeCode,
    path: claudeConfigPath,
    seed: `${JSON.stringify({ numStartups: 3, mcpServers: { other: { type: "stdio", command: "/bin/echo", args: ["hi"], env: {} } } }, null, 2)}\n`,
    servers: (t) => JSON.parse(t).mcpServers,
    unrelated: (t) => JSON.parse(t).numStartups,
    disable: null,
  },
  {
    host: codex,
    path: codexConfigPath,
    seed: `# my codex config\nmodel = "o3"   # keep me\n\n[mcp_servers.other]\ncommand = "/bin/echo"\nargs = ["hi"]\n\n[profiles.x]\nmodel = "gpt-5"\n`,
    servers: (t) => (parseToml(t) as any).mcp_servers,
    unrelated: (t) => [(parseToml(t) as any).model, (parseToml(t) as any).profiles],
    disable: (t) => t.replace("[mcp_servers.pyro]\n", "[mcp_servers.pyro]\nenabled = false\n"),
  },
  {
    host: opencode,
    path: opencodeConfigPath,
    seed: `${JSON.stringify({ $schema: "https://opencode.ai/config.json", autoupdate: false, mcp: { other: { type: "local", command: ["/bin/echo", "hi"] } } }, null, 2)}\n`,
    servers: (t) => JSON.parse(t).mcp,
    unrelated: (t) => JSON.parse(t).autoupdate,
    disable: (t) => {
      const doc = JSON.parse(t);
      doc.mcp.pyro.enabled = false;
      return JSON.stringify(doc, null, 2);
    },
  },
];

describe.each(cases)("$host.name config merging", (c) => {
  let home: TempHome;
  let path: string;
  const seedServers = c.servers(c.seed);
  const seedUnrelated = c.unrelated(c.seed);

  beforeEach(async () => {
    home = await tempHome();
    path = c.path(home.ctx);
    await mkdir(dirname(path), { recursive: true });
    await writeFile(path, c.seed);
  });
  afterEach(async () => {
    await home.cleanup();
  });

  const text = () => readFile(path, "utf8");
  const expectOthersIntact = async () => {
    const t = await text();
    expect(c.servers(t).other).toEqual(seedServers.other);
    expect(c.unrelated(t)).toEqual(seedUnrelated);
  };
  const repair = () => c.host.repair(home.ctx, { launch: fakeLaunch });

  it("connect adds pyro and keeps other servers and unrelated settings", async () => {
    const r = await c.host.connect(home.ctx, fakeLaunch());
    expect(r).toMatchObject({
      host: c.host.name,
      action: "added",
      method: "file",
      config_path: path,
      starts: true,
    });
    expect(Object.keys(c.servers(await text())).sort()).toEqual(["other", "pyro"]);
    await expectOthersIntact();
  });

  it("connect is idempotent: the second one changes nothing, byte for byte", async () => {
    await c.host.connect(home.ctx, fakeLaunch(), { verify: false });
    const first = await text();
    const r = await c.host.connect(home.ctx, fakeLaunch(), { verify: false });
    expect(r.action).toBe("unchanged");
    expect(r.method).toBe("none");
    expect(await text()).toBe(first);
  });

  it("connect updates an entry that launches something else, and only that entry", async () => {
    await c.host.connect(home.ctx, fakeLaunch({ profile: "vm-run" }), { verify: false });
    const r = await c.host.connect(home.ctx, fakeLaunch(), { verify: false });
    expect(r.action).toBe("updated");
    expect(r.args).toEqual([FAKE_SERVER, "mcp", "serve"]);
    await expectOthersIntact();
  });

  it("check reports a missing entry without starting anything", async () => {
    const r = await c.host.check(home.ctx);
    expect(r).toMatchObject({ configured: false, status: "missing", starts: null, installed: false });
  });

  it("check reports a healthy entry as ok, having started it", async () => {
    await c.host.connect(home.ctx, fakeLaunch(), { verify: false });
    const r = await c.host.check(home.ctx);
    expect(r.status).toBe("ok");
    expect(r.problems).toEqual([]);
    expect(r.starts).toBe(true);
    expect(r.start?.tool_count).toBe(1);
  });

  it("detects an entry whose launcher is gone, and repair restores it", async () => {
    await c.host.connect(home.ctx, fakeLaunch(), { verify: false });
    await writeFile(path, (await text()).replaceAll(FAKE_SERVER, "/nonexistent/bin/pyro.js"));
    const broken = await c.host.check(home.ctx);
    expect(broken.status).toBe("broken");
    expect(broken.problems.join("\n")).toMatch(/launcher \/nonexistent\/bin\/pyro\.js does not exist/);

    const r = await repair();
    expect(r.action).toBe("repaired");
    expect(r.before.status).toBe("broken");
    expect(r.after.status).toBe("ok");
    expect(r.after.args).toEqual([FAKE_SERVER, "mcp", "serve"]);
    await expectOthersIntact();
  });

  it("detects an entry that does not start", async () => {
    await c.host.connect(home.ctx, fakeLaunch(), { verify: false });
    // Same shape, but the "server" exits at once: only starting it tells.
    const dying = (await text()).replaceAll(FAKE_SERVER, `${dirname(FAKE_SERVER)}/does-not-exist-either.js`);
    await writeFile(path, dying);
    const viaNode = await c.host.check(home.ctx);
    expect(viaNode.status).toBe("broken");
    await c.host.connect(
      home.ctx,
      { server_name: "pyro", command: process.execPath, args: ["-e", "process.exit(3)", "mcp", "serve"] },
      { verify: false },
    );
    const r = await c.host.check(home.ctx);
    expect(r.status).toBe("broken");
    expect(r.starts).toBe(false);
    expect(r.problems.join("\n")).toMatch(/pyro does not start/);
  });

  // Claude Code has no per-entry switch in its config, so the case exists only where one does.
  const disable = c.disable;
  if (disable)
    it("detects a disabled entry, and repair switches it back on", async () => {
      await c.host.connect(home.ctx, fakeLaunch(), { verify: false });
      await writeFile(path, disable(await text()));
      const broken = await c.host.check(home.ctx);
      expect(broken.status).toBe("broken");
      expect(broken.problems).toContain("the entry is disabled");
      const r = await repair();
      expect(r.after.status).toBe("ok");
      await expectOthersIntact();
    });

  it("repair adds a missing entry", async () => {
    const r = await repair();
    expect(r.before.status).toBe("missing");
    expect(r.after.status).toBe("ok");
    await expectOthersIntact();
  });

  it("repair leaves a healthy entry alone", async () => {
    await c.host.connect(home.ctx, fakeLaunch(), { verify: false });
    const before = await text();
    const r = await repair();
    expect(r.action).toBe("none");
    expect(await text()).toBe(before);
  });

  it("repair keeps the serve options the broken entry carried", async () => {
    await c.host.connect(home.ctx, fakeLaunch({ profile: "workspace-full", allow_host_compat: true }), {
      verify: false,
    });
    await writeFile(path, (await text()).replaceAll(FAKE_SERVER, "/nonexistent/bin/pyro.js"));
    const r = await repair();
    expect(r.after.status).toBe("ok");
    expect(r.after.args).toEqual([
      FAKE_SERVER,
      "mcp",
      "serve",
      "--profile",
      "workspace-full",
      "--allow-host-compat",
    ]);
  });

  it("disconnect removes pyro and nothing else; a second disconnect reports no change", async () => {
    await c.host.connect(home.ctx, fakeLaunch(), { verify: false });
    const r = await c.host.disconnect(home.ctx);
    expect(r).toEqual({
      host: c.host.name,
      changed: true,
      method: "file",
      config_path: path,
      server_name: "pyro",
      notes: [],
    });
    expect(Object.keys(c.servers(await text()))).toEqual(["other"]);
    await expectOthersIntact();
    expect((await c.host.check(home.ctx)).status).toBe("missing");

    const after = await text();
    const again = await c.host.disconnect(home.ctx);
    expect(again).toMatchObject({ changed: false, method: "none" });
    expect(await text()).toBe(after);
  });

  it("connect then disconnect gives the seed back byte for byte", async () => {
    await c.host.connect(home.ctx, fakeLaunch({ profile: "workspace-full" }), { verify: false });
    await c.host.disconnect(home.ctx);
    expect(await text()).toBe(c.seed);
  });

  it("disconnect with no config at all changes nothing and creates no file", async () => {
    await rm(path);
    const r = await c.host.disconnect(home.ctx);
    expect(r).toMatchObject({ changed: false, method: "none", config_path: path });
    await expect(stat(path)).rejects.toMatchObject({ code: "ENOENT" });
  });

  it("refuses to rewrite a config it cannot parse, and leaves it untouched", async () => {
    const garbage = `${c.seed.slice(0, Math.floor(c.seed.length / 2))}\n}{ not a config\n`;
    await writeFile(path, garbage);
    await expect(c.host.connect(home.ctx, fakeLaunch())).rejects.toMatchObject({ code: "conflict" });
    await expect(repair()).rejects.toMatchObject({ code: "conflict" });
    await expect(c.host.disconnect(home.ctx)).rejects.toMatchObject({ code: "conflict" });
    expect(await text()).toBe(garbage);
    const r = await c.host.check(home.ctx);
    expect(r.status).toBe("broken");
    expect(r.problems[0]).toMatch(/cannot parse/);
  });

  it("writes through a symlinked config and keeps the link", async () => {
    const real = join(home.dir, "dotfiles", "config");
    await mkdir(dirname(real), { recursive: true });
    await writeFile(real, c.seed);
    await rm(path);
    await symlink(real, path);
    await c.host.connect(home.ctx, fakeLaunch(), { verify: false });
    expect((await lstat(path)).isSymbolicLink()).toBe(true);
    expect(Object.keys(c.servers(await readFile(real, "utf8"))).sort()).toEqual(["other", "pyro"]);
  });
});

describe("new config files", () => {
  let home: TempHome;
  beforeEach(async () => {
    home = await tempHome();
  });
  afterEach(async () => {
    await home.cleanup();
  });

  it("Claude Code's and Codex's are private to the user, OpenCode's carries its schema", async () => {
    for (const h of [claudeCode, codex, opencode]) await h.connect(home.ctx, fakeLaunch(), { verify: false });
    expect((await stat(claudeConfigPath(home.ctx))).mode & 0o777).toBe(0o600);
    expect((await stat(codexConfigPath(home.ctx))).mode & 0o777).toBe(0o600);
    const oc = JSON.parse(await readFile(opencodeConfigPath(home.ctx), "utf8"));
    expect(oc.$schema).toBe("https://opencode.ai/config.json");
    expect(oc.mcp.pyro).toEqual({
      type: "local",
      command: [process.execPath, FAKE_SERVER, "mcp", "serve"],
      enabled: true,
    });
  });

  it("honours CLAUDE_CONFIG_DIR and CODEX_HOME", async () => {
    const ctx = {
      ...home.ctx,
      env: { ...home.ctx.env, CLAUDE_CONFIG_DIR: join(home.dir, "cc"), CODEX_HOME: join(home.dir, "cx") },
    };
    expect(claudeConfigPath(ctx)).toBe(join(home.dir, "cc", ".claude.json"));
    expect(codexConfigPath(ctx)).toBe(join(home.dir, "cx", "config.toml"));
  });

  it("a PYRO_<HOST>_BIN that names no executable counts as not installed, with the reason", async () => {
    const ctx = { ...home.ctx, env: { ...home.ctx.env, PYRO_CODEX_BIN: join(home.dir, "nope") } };
    const d = await codex.detect(ctx);
    expect(d.installed).toBe(false);
    expect(d.reason).toMatch(/PYRO_CODEX_BIN/);
  });
});
