import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PYRO_BIN, pyro } from "../helpers/cli.js";

/**
 * The `pyro host` surface through the built CLI, in a throwaway HOME with no host CLIs
 * on PATH (so connect edits files). Starting pyro is the real-host suites' job: these
 * run with --no-verify / --no-start.
 */
let home: string;
let env: NodeJS.ProcessEnv;
beforeAll(async () => {
  home = await mkdtemp(join(tmpdir(), "pyro-cli-host-"));
  env = {
    HOME: home,
    XDG_CONFIG_HOME: join(home, ".config"),
    PATH: "/usr/bin:/bin",
    CLAUDE_CONFIG_DIR: "",
    CODEX_HOME: "",
    PYRO_CLAUDE_BIN: "",
    PYRO_CODEX_BIN: "",
    PYRO_OPENCODE_BIN: "",
  };
});
afterAll(async () => {
  await rm(home, { recursive: true, force: true });
});

describe("pyro host", () => {
  it("print-config generic --json gives the mcpServers snippet for this pyro", () => {
    const r = pyro(["host", "print-config", "generic", "--profile", "workspace-full", "--json"], env);
    expect(r.code).toBe(0);
    const out = r.json();
    expect(Object.keys(out).sort()).toEqual(
      [
        "args",
        "cli_command",
        "command",
        "config_location",
        "format",
        "host",
        "server_name",
        "snippet",
      ].sort(),
    );
    expect(JSON.parse(out.snippet)).toEqual({
      mcpServers: {
        pyro: { command: process.execPath, args: [PYRO_BIN, "mcp", "serve", "--profile", "workspace-full"] },
      },
    });
  });

  it("print-config prints a valid config on stdout and the host-CLI line on stderr", () => {
    const r = pyro(["host", "print-config", "claude-code"], env);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout).mcpServers.pyro.command).toBe(process.execPath);
    expect(r.stderr).toMatch(/^# or run: claude mcp add pyro --scope user -- /);
  });

  it("print-config codex gives the table with its timeouts, and no `codex mcp add` line (it cannot set them)", () => {
    const r = pyro(["host", "print-config", "codex"], env);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^\[mcp_servers\.pyro\]\ncommand = /);
    expect(r.stdout).toMatch(/^tool_timeout_sec = 87000$/m);
    expect(r.stdout).toMatch(/^startup_timeout_sec = 30$/m);
    expect(r.stderr).toBe("");
  });

  it("connect writes the entry once and says so; the second run is unchanged", async () => {
    const first = pyro(["host", "connect", "opencode", "--no-verify", "--json"], env);
    expect(first.code, first.stderr).toBe(0);
    expect(first.json()).toEqual({
      host: "opencode",
      action: "added",
      method: "file",
      config_path: join(home, ".config", "opencode", "opencode.json"),
      server_name: "pyro",
      command: process.execPath,
      args: [PYRO_BIN, "mcp", "serve"],
      starts: null,
    });
    const again = pyro(["host", "connect", "opencode", "--no-verify"], env);
    expect(again.code).toBe(0);
    expect(again.stdout).toMatch(/already connected/);
    const doc = JSON.parse(await readFile(join(home, ".config", "opencode", "opencode.json"), "utf8"));
    expect(doc.mcp.pyro.command).toEqual([process.execPath, PYRO_BIN, "mcp", "serve"]);
  });

  it("doctor --json reports every host, with the fix for what is missing", () => {
    const r = pyro(["host", "doctor", "--no-start", "--json"], env);
    expect(r.code).toBe(0);
    const hosts = r.json().hosts;
    expect(hosts.map((h: { host: string }) => h.host)).toEqual(["claude-code", "codex", "opencode"]);
    expect(hosts[0]).toMatchObject({
      installed: false,
      configured: false,
      status: "missing",
      fix: "pyro host connect claude-code",
    });
    expect(hosts[2]).toMatchObject({ configured: true, status: "ok", starts: null, fix: null });
  });

  it("disconnect removes the entry and says so; the second run reports no change", async () => {
    const path = join(home, ".config", "opencode", "opencode.json");
    expect(pyro(["host", "connect", "opencode", "--no-verify"], env).code).toBe(0);
    const first = pyro(["host", "disconnect", "opencode", "--json"], env);
    expect(first.code, first.stderr).toBe(0);
    expect(first.json()).toEqual({
      host: "opencode",
      changed: true,
      method: "file",
      config_path: path,
      server_name: "pyro",
      notes: [],
    });
    expect(JSON.parse(await readFile(path, "utf8")).mcp).toEqual({});
    const again = pyro(["host", "disconnect", "opencode"], env);
    expect(again.code).toBe(0);
    expect(again.stdout).toBe(`opencode: not connected (no 'pyro' entry in ${path})\n`);
    expect(pyro(["host", "disconnect", "opencode", "--json"], env).json().changed).toBe(false);
    expect(pyro(["host", "connect", "opencode", "--no-verify"], env).stdout).toMatch(/added 'pyro'/);
    expect(pyro(["host", "disconnect", "opencode"], env).stdout).toBe(
      `opencode: removed 'pyro' from ${path}\n`,
    );
  });

  it("disconnect of an unknown host is a structured error, without a stack trace", () => {
    const r = pyro(["host", "disconnect", "vim", "--json"], env);
    expect(r.code).toBe(1);
    expect(r.json()).toEqual({
      error: {
        code: "invalid_argument",
        message: "unknown host 'vim'",
        hint: "hosts: claude-code, codex, opencode",
      },
    });
    expect(r.stderr).toBe(
      "pyro: error [invalid_argument]: unknown host 'vim' (hint: hosts: claude-code, codex, opencode)\n",
    );
  });

  it("an unknown host is a one-line invalid_argument error, and JSON under --json", () => {
    const r = pyro(["host", "connect", "vim", "--json"], env);
    expect(r.code).toBe(1);
    expect(r.json()).toEqual({
      error: {
        code: "invalid_argument",
        message: "unknown host 'vim'",
        hint: "hosts: claude-code, codex, opencode",
      },
    });
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
  });

  it("refuses serve options mcp serve would refuse, before writing anything", () => {
    const r = pyro(["host", "connect", "codex", "--mode", "inspect", "--profile", "vm-run"], env);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/mutually exclusive/);
  });
});
