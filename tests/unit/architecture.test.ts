import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, normalize, relative } from "node:path";
import { describe, expect, it } from "vitest";
import { REPO_ROOT } from "../helpers/cli.js";

/**
 * The floors of src/ and the one direction of their imports (docs/architecture.md):
 *
 *   surfaces (cli, mcp, sdk, hosts, bench) → core → backends, env, state, net → ground → agent
 *
 * - agent/ is the bottom: it runs inside guests and imports nothing from outside agent/.
 * - the ground floor (errors.ts, names.ts, util/) is the shared vocabulary; it may use
 *   the agent's error type and nothing above.
 * - backends, env, state and net (the host-side egress proxy) may use each other, the
 *   ground floor and the agent.
 * - core may use everything below it.
 * - surfaces reach the floors below core only through core (core/vocabulary.ts
 *   re-exports the names they need); bench alone measures backends directly (its rows
 *   compare a backend's raw floor with the product's path).
 *
 * An import that points up, or a surface that reaches past core, fails this test.
 */
const SRC = join(REPO_ROOT, "src");

type Floor = "agent" | "ground" | "lower" | "core" | "surface";
const RANK: Record<Floor, number> = { agent: 0, ground: 1, lower: 2, core: 3, surface: 4 };

function floorOf(file: string): Floor {
  const rel = relative(SRC, file);
  const top = rel.split("/")[0]!;
  if (top === "agent") return "agent";
  if (rel === "errors.ts" || rel === "names.ts" || top === "util") return "ground";
  if (top === "backends" || top === "env" || top === "state" || top === "net") return "lower";
  if (top === "core") return "core";
  return "surface";
}

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sources(join(dir, e.name)) : e.name.endsWith(".ts") ? [join(dir, e.name)] : [],
  );
}

/** Relative imports of a file (static, dynamic and re-exports), as source paths. */
function importsOf(file: string): string[] {
  const text = readFileSync(file, "utf8");
  const out: string[] = [];
  for (const m of text.matchAll(/(?:\bfrom|\bimport)\s*\(?\s*"(\.{1,2}\/[^"]+)"/g))
    out.push(normalize(join(dirname(file), m[1]!)).replace(/\.js$/, ".ts"));
  return out;
}

function violations(): string[] {
  const bad: string[] = [];
  for (const file of sources(SRC)) {
    const from = floorOf(file);
    for (const target of importsOf(file)) {
      const to = floorOf(target);
      const up = RANK[to] > RANK[from];
      const agentOut = from === "agent" && to !== "agent";
      const pastCore = from === "surface" && to === "lower" && !relative(SRC, file).startsWith("bench/");
      if (up || agentOut || pastCore)
        bad.push(`${relative(SRC, file)} (${from}) → ${relative(SRC, target)} (${to})`);
    }
  }
  return bad;
}

describe("the floors of src/", () => {
  it("every import points down (or across a floor), never up, and surfaces go through core", () => {
    expect(violations()).toEqual([]);
  });

  it("MCP tools call the core directly, never through the SDK (one translation of their arguments)", () => {
    // The tools and their context (tool.ts: what a handler gets, once the Pyro object).
    const tools = [...sources(join(SRC, "mcp", "tools")), join(SRC, "mcp", "tool.ts")];
    const viaSdk = tools.flatMap((f) =>
      importsOf(f)
        .filter((t) => relative(SRC, t).startsWith("sdk/"))
        .map((t) => `${relative(SRC, f)} → ${relative(SRC, t)}`),
    );
    expect(viaSdk).toEqual([]);
    // Not vacuous: the exec tools do import the core's exec.
    expect(importsOf(join(SRC, "mcp", "tools", "exec.ts"))).toContain(join(SRC, "core", "exec.ts"));
  });

  it("the check sees imports of every kind (it is not vacuous)", () => {
    const all = sources(SRC).flatMap(importsOf);
    expect(all.length).toBeGreaterThan(300);
    // The CLI loads its command groups with dynamic imports: those count too.
    expect(importsOf(join(SRC, "cli", "main.ts")).some((t) => t.endsWith("commands/mcp.ts"))).toBe(true);
    expect(floorOf(join(SRC, "mcp", "server.ts"))).toBe("surface");
    expect(floorOf(join(SRC, "errors.ts"))).toBe("ground");
  });
});
