import { readdirSync, readFileSync } from "node:fs";
import { join, relative, resolve } from "node:path";
import { describe, expect, it } from "vitest";
import { BACKEND_NAMES } from "../../../src/backends/backend.js";
import {
  CONFIG_VARS,
  configTable,
  configValue,
  debugEnabled,
  hostBinOverride,
  loadConfig,
  resolvePaths,
} from "../../../src/core/config.js";
import { Engine } from "../../../src/core/engine.js";
import { REPO_ROOT } from "../../helpers/cli.js";

const SRC = join(REPO_ROOT, "src");
const CONFIG_MODULE = "core/config.ts";
/** The guest agent reads its own variables: it runs inside the sandbox (see agent/guest/agent.ts). */
const GUEST = "agent/";
const GUEST_VARS = new Set(["PYRO_AGENT_DEBUG", "PYRO_EXEC_TOKEN"]);

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sources(join(dir, e.name)) : e.name.endsWith(".ts") ? [join(dir, e.name)] : [],
  );
}

/** `env.PYRO_X`, `process.env.PYRO_X`, `env["PYRO_X"]`, `env?.PYRO_X` outside comments. */
const READ = /\benv\s*(?:\?\.|\.|\[\s*["'`])\s*PYRO_[A-Z0-9_]+/g;

function readsIn(text: string): string[] {
  const code = text.replace(/\/\*[\s\S]*?\*\//g, "").replace(/^\s*\/\/.*$/gm, "");
  return [...code.matchAll(READ)].map((m) => m[0]);
}

function strayReads(): string[] {
  return sources(SRC).flatMap((file) => {
    const rel = relative(SRC, file);
    if (rel === CONFIG_MODULE || rel.startsWith(GUEST)) return [];
    return readsIn(readFileSync(file, "utf8")).map((r) => `${rel}: ${r}`);
  });
}

describe("PYRO_* variables are read in one place", () => {
  it("nothing in src/ outside core/config.ts (and the guest agent) reads a PYRO_* variable", () => {
    expect(strayReads()).toEqual([]);
  });

  it("the scan sees reads of every spelling (it is not vacuous)", () => {
    expect(readsIn("const a = process.env.PYRO_HOME;")).toEqual(["env.PYRO_HOME"]);
    expect(readsIn("if (ctx.env.PYRO_FIRECRACKER_BIN) x();")).toEqual(["env.PYRO_FIRECRACKER_BIN"]);
    expect(readsIn('const b = env["PYRO_DEBUG"];')).toEqual(['env["PYRO_DEBUG']);
    expect(readsIn("/** set env.PYRO_HOME */\n// env.PYRO_X\nconst c = 1;")).toEqual([]);
    // The guest agent is the known reader the scan lets through.
    const agent = readFileSync(join(SRC, "agent", "guest", "agent.ts"), "utf8");
    expect(readsIn(agent)).toEqual(["env.PYRO_AGENT_DEBUG"]);
  });

  it("every PYRO_* name src/ mentions is declared in the config schema (or is the guest agent's own)", () => {
    const declared = new Set([...Object.keys(CONFIG_VARS), ...GUEST_VARS]);
    const mentioned = new Set<string>();
    for (const file of sources(SRC)) {
      if (relative(SRC, file).startsWith(GUEST)) continue;
      for (const m of readFileSync(file, "utf8").matchAll(/\bPYRO_[A-Z0-9_]*[A-Z0-9]\b/g))
        mentioned.add(m[0]);
    }
    expect([...mentioned].filter((n) => !declared.has(n)).sort()).toEqual([]);
  });
});

describe("the config schema", () => {
  it("describes every variable and its default", () => {
    for (const [name, v] of Object.entries(CONFIG_VARS)) {
      expect(name).toMatch(/^PYRO_[A-Z0-9_]+$/);
      expect(v.description.length, name).toBeGreaterThan(10);
      expect(v.default.length, name).toBeGreaterThan(0);
    }
  });

  it("docs/configuration.md has a row for every declared variable and none that is not declared", () => {
    const doc = readFileSync(join(REPO_ROOT, "docs", "configuration.md"), "utf8");
    const rows = [...doc.matchAll(/^\| `(PYRO_[A-Z0-9_]+)` \|/gm)].map((m) => m[1]);
    expect(rows).toEqual(Object.keys(CONFIG_VARS));
    // Verbatim, so a description or default changed in the schema shows up in the docs.
    expect(doc).toContain(configTable());
  });

  it("takes an option over the variable over the default", () => {
    const env = { PYRO_HOME: "/h/env", PYRO_ENV_CACHE: "/c/env", XDG_CACHE_HOME: "/xdg" };
    expect(resolvePaths({ env, home: "/h/opt" }).home).toBe("/h/opt");
    expect(resolvePaths({ env }).home).toBe("/h/env");
    expect(resolvePaths({ env: { XDG_CACHE_HOME: "/xdg" } }).home).toBe("/xdg/pyro");
    expect(resolvePaths({ env, environmentsDir: "/c/opt" }).environmentsDir).toBe("/c/opt");
    expect(resolvePaths({ env }).environmentsDir).toBe("/c/env");
    expect(resolvePaths({ env: { PYRO_HOME: "/h" } }).environmentsDir).toBe("/h/environments");
    expect(loadConfig({ env: { PYRO_DEBIAN_MIRROR: "http://env" }, mirror: "http://opt" }).debianMirror).toBe(
      "http://opt",
    );
    expect(loadConfig({ env: { PYRO_DEBIAN_MIRROR: "http://env" } }).debianMirror).toBe("http://env");
    expect(loadConfig({ env: {} }).debianMirror).toBeUndefined();
  });

  it("keeps each variable's meaning: empty is unset, PYRO_DEBUG is a flag, a bad timeout is ignored", () => {
    expect(configValue({ PYRO_FIRECRACKER_BIN: "" }, "PYRO_FIRECRACKER_BIN")).toBeUndefined();
    expect(configValue({ PYRO_SECRET_KEY_FILE: "/k" }, "PYRO_SECRET_KEY_FILE")).toBe("/k");
    for (const off of ["", "0", "false"]) expect(debugEnabled({ PYRO_DEBUG: off })).toBe(false);
    expect(debugEnabled({ PYRO_DEBUG: "1" })).toBe(true);
    expect(debugEnabled({})).toBe(false);
    expect(configValue({ PYRO_HOST_TIMEOUT_SECONDS: "2.5" }, "PYRO_HOST_TIMEOUT_SECONDS")).toBe(2.5);
    for (const bad of ["abc", "-1", "0", ""])
      expect(configValue({ PYRO_HOST_TIMEOUT_SECONDS: bad }, "PYRO_HOST_TIMEOUT_SECONDS")).toBeUndefined();
    // PYRO_BACKEND is checked where it is used: even an empty one is an unknown backend.
    expect(configValue({ PYRO_BACKEND: "" }, "PYRO_BACKEND")).toBe("");
    expect(hostBinOverride({ PYRO_CODEX_BIN: "/bin/codex" }, "PYRO_CODEX_BIN")).toBe("/bin/codex");
    expect(() => hostBinOverride({}, "PYRO_NOPE_BIN")).toThrow(/not a declared/);
  });

  it("sizes the pool: option, then PYRO_POOL (capped, a bad value ignored), then the caller's default", () => {
    expect(loadConfig({ env: {} }).pool).toBe(0);
    expect(loadConfig({ env: {}, poolDefault: 1 }).pool).toBe(1);
    expect(loadConfig({ env: { PYRO_POOL: "0" }, poolDefault: 1 }).pool).toBe(0);
    expect(loadConfig({ env: { PYRO_POOL: "3" } }).pool).toBe(3);
    expect(loadConfig({ env: { PYRO_POOL: "9" } }).pool).toBe(4);
    for (const bad of ["abc", "-1", "1.5", "", " "])
      expect(loadConfig({ env: { PYRO_POOL: bad }, poolDefault: 1 }).pool).toBe(1);
    expect(loadConfig({ env: { PYRO_POOL: "3" }, pool: 2 }).pool).toBe(2);
    for (const bad of [-1, 5, 1.5, Number.NaN])
      expect(() => loadConfig({ env: {}, pool: bad })).toThrow(
        expect.objectContaining({ code: "invalid_argument" }),
      );
  });

  it("the engine reads its configuration once, builds every registry backend and passes values down", async () => {
    const home = resolve("/tmp/pyro-config-test-home");
    const e = new Engine({ env: { PYRO_HOME: home, PYRO_FIRECRACKER_BIN: "/opt/firecracker" } });
    expect(e.paths.home).toBe(home);
    expect(e.backendSettings).toEqual({ firecrackerBin: "/opt/firecracker" });
    expect(e.implemented()).toEqual([...BACKEND_NAMES]);
    for (const name of BACKEND_NAMES) expect(e.backend(name).name).toBe(name);
    await e.close();
  });
});
