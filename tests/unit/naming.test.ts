import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";
import ts from "typescript";
import { describe, expect, it } from "vitest";
import { REPO_ROOT } from "../helpers/cli.js";

/**
 * The core's naming rule (docs/architecture.md, "Naming"): what a surface hands a core
 * operation for one call (the `options` or `patch` argument of an exported function of
 * src/core/, or of a public `Workspaces` method) is spelled snake_case, like the MCP
 * arguments and like every result, so MCP passes its arguments through unrenamed and
 * the SDK's one translation (sdk/case.ts) is mechanical. The engine's construction
 * options are camelCase JavaScript settings (CONSTRUCTION below), and so are the options
 * of the floors below core.
 *
 * The check is syntactic: an options type is a type literal, or an interface or type
 * alias declared in src/core/ (with the interfaces it extends); a type from elsewhere
 * must be listed in CONSTRUCTION with its reason, so nothing goes unchecked silently.
 */
const CORE = join(REPO_ROOT, "src", "core");

/** Options types that are not per-call inputs, with why they are camelCase. */
const CONSTRUCTION: Record<string, string> = {
  PathOptions: "where the engine keeps its files: the SDK's PyroOptions, as given",
  ConfigOptions: "the engine's configuration: the SDK's PyroOptions, as given",
  EngineOptions: "the engine's construction options (tests replace backends and builders)",
  PullOptions:
    "the environment cache's own options (env/cache.ts): seedRecipeEnvironment is the engine's plumbing for a create's recipe, not an operation a surface calls",
};

const SNAKE = /^[a-z][a-z0-9]*(_[a-z0-9]+)*$/;

interface Declared {
  members: string[];
  extends: string[];
}

/** Interfaces and object-literal type aliases declared in the given sources, by name. */
function declaredTypes(files: ts.SourceFile[]): Map<string, Declared> {
  const out = new Map<string, Declared>();
  const names = (members: ts.NodeArray<ts.TypeElement>, sf: ts.SourceFile) =>
    members.flatMap((m) => (m.name ? [m.name.getText(sf)] : []));
  for (const sf of files)
    for (const st of sf.statements) {
      if (ts.isInterfaceDeclaration(st))
        out.set(st.name.text, {
          members: names(st.members, sf),
          extends: (st.heritageClauses ?? []).flatMap((h) => h.types.map((t) => t.expression.getText(sf))),
        });
      else if (ts.isTypeAliasDeclaration(st) && ts.isTypeLiteralNode(st.type))
        out.set(st.name.text, { members: names(st.type.members, sf), extends: [] });
    }
  return out;
}

/** The `options`/`patch` parameters of exported functions and of the Workspaces class's public methods. */
function inputParams(sf: ts.SourceFile): { where: string; type: ts.TypeNode | undefined }[] {
  const out: { where: string; type: ts.TypeNode | undefined }[] = [];
  const exported = (n: ts.Node) =>
    ts.canHaveModifiers(n) && (ts.getModifiers(n) ?? []).some((m) => m.kind === ts.SyntaxKind.ExportKeyword);
  const take = (where: string, params: ts.NodeArray<ts.ParameterDeclaration>) => {
    for (const p of params) {
      const name = p.name.getText(sf);
      // A `patch` may be a diff's text: only object types are options.
      const text = p.type && p.type.kind === ts.SyntaxKind.StringKeyword;
      if ((name === "options" || name === "patch") && !text)
        out.push({ where: `${where}(${name})`, type: p.type });
    }
  };
  for (const st of sf.statements) {
    if (ts.isFunctionDeclaration(st) && st.name && exported(st)) take(st.name.text, st.parameters);
    if (ts.isClassDeclaration(st) && st.name?.text === "Workspaces" && exported(st))
      for (const m of st.members) {
        const hidden = (ts.getModifiers(m) ?? []).some((x) => x.kind === ts.SyntaxKind.PrivateKeyword);
        if (ts.isMethodDeclaration(m) && !hidden) take(`Workspaces.${m.name.getText(sf)}`, m.parameters);
      }
  }
  return out;
}

/** Every key of an options type that is not snake_case, and types it could not see into. */
function violations(files: ts.SourceFile[]): { bad: string[]; checked: Map<string, string[]> } {
  const types = declaredTypes(files);
  const bad: string[] = [];
  const checked = new Map<string, string[]>();
  const keysOf = (name: string, where: string): string[] => {
    const d = types.get(name);
    if (!d) {
      if (!CONSTRUCTION[name]) bad.push(`${where}: ${name} is not declared in src/core/`);
      return [];
    }
    if (CONSTRUCTION[name]) return [];
    return [...d.members, ...d.extends.flatMap((e) => keysOf(e, where))];
  };
  for (const sf of files)
    for (const { where, type } of inputParams(sf)) {
      const at = `${relative(CORE, sf.fileName)}:${where}`;
      let keys: string[] = [];
      if (type && ts.isTypeLiteralNode(type))
        keys = type.members.flatMap((m) => (m.name ? [m.name.getText(sf)] : []));
      else if (type && ts.isTypeReferenceNode(type)) keys = keysOf(type.typeName.getText(sf), at);
      else bad.push(`${at}: its type is not a literal or a named type`);
      checked.set(at, keys);
      for (const k of keys) if (!SNAKE.test(k)) bad.push(`${at}: ${k}`);
    }
  return { bad, checked };
}

function coreSources(): ts.SourceFile[] {
  return readdirSync(CORE)
    .filter((f) => f.endsWith(".ts"))
    .map((f) => {
      const path = join(CORE, f);
      return ts.createSourceFile(path, readFileSync(path, "utf8"), ts.ScriptTarget.ES2022, true);
    });
}

describe("the core's naming rule", () => {
  it("per-call inputs of core operations are snake_case", () => {
    const { bad, checked } = violations(coreSources());
    expect(bad).toEqual([]);
    // Not vacuous: it sees the operations' option types, through names and `extends`.
    expect(checked.size).toBeGreaterThan(20);
    expect(checked.get("shells.ts:readShell(options)")).toContain("wait_for_idle_ms");
    expect(checked.get("workspaces.ts:Workspaces.create(options)")).toContain("repo_url");
    expect(checked.get("workspaces.ts:Workspaces.update(patch)")).toContain("set_labels");
  });

  it("refuses a camelCase option, in a literal or a named type (the check can fail)", () => {
    const sf = (text: string) =>
      ts.createSourceFile(join(CORE, "probe.ts"), text, ts.ScriptTarget.ES2022, true);
    const { bad } = violations([
      sf(
        "export interface O { waitForIdleMs?: number }\n" +
          "export function a(ws: unknown, options: O = {}) {}\n" +
          "export function b(options: { maxBytes?: number }) {}\n" +
          "export function c(options: Elsewhere) {}\n" +
          "export class Workspaces { update(id: string, patch: { setLabels?: string[] }) {} }\n",
      ),
    ]);
    expect(bad).toEqual([
      "probe.ts:a(options): waitForIdleMs",
      "probe.ts:b(options): maxBytes",
      "probe.ts:c(options): Elsewhere is not declared in src/core/",
      "probe.ts:Workspaces.update(patch): setLabels",
    ]);
  });
});
