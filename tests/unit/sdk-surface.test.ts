import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import ts from "typescript";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ERROR_CODES } from "../../src/errors.js";
import { snakeKey } from "../../src/sdk/case.js";
import * as sdk from "../../src/sdk/index.js";
import { SIGNATURES } from "../../src/sdk/schemas.js";
import { REPO_ROOT } from "../helpers/cli.js";

describe("public SDK surface", () => {
  it("exports exactly the documented names", () => {
    expect(Object.keys(sdk).sort()).toEqual([
      "BACKEND_NAMES",
      "DEFAULT_ENVIRONMENT",
      "ERROR_CODES",
      "OFFICIAL_ENVIRONMENTS",
      "Pyro",
      "PyroError",
    ]);
  });

  it("offers one camelCase method per operation (getWorkspace, no workspaceStatus alias)", () => {
    const methods = Object.getOwnPropertyNames(sdk.Pyro.prototype)
      .filter((m) => m !== "constructor")
      .sort();
    expect(methods).toEqual(
      [
        "applyWorkspacePatch",
        "buildEnvironment",
        "close",
        "commitWorkspace",
        "createSnapshot",
        "createWorkspace",
        "deleteSnapshot",
        "deleteWorkspace",
        "demo",
        "diffWorkspace",
        "doctor",
        "execWorkspace",
        "exportWorkspace",
        "getWorkspace",
        "inspectEnvironment",
        "listEnvironments",
        "listSnapshots",
        "listWorkspaceFiles",
        "listServices",
        "listWorkspaces",
        "listWorkspaceDisk",
        "readWorkspaceDisk",
        "exportWorkspaceDisk",
        "openShell",
        "writeShell",
        "readShell",
        "signalShell",
        "resizeShell",
        "closeShell",
        "listShells",
        "serviceLogs",
        "serviceStatus",
        "startService",
        "stopService",
        "approveNetwork",
        "networkBlocks",
        "prepare",
        "pruneEnvironments",
        "pullEnvironment",
        "readWorkspaceFile",
        "resetWorkspace",
        "run",
        "startWorkspace",
        "stopWorkspace",
        "summarizeWorkspace",
        "syncPushWorkspace",
        "updateWorkspace",
        "workspaceLogs",
        "writeWorkspaceFile",
      ].sort(),
    );
  });

  it("pins the error codes callers branch on", () => {
    expect(ERROR_CODES).toEqual(
      expect.arrayContaining([
        "workspace_not_found",
        "environment_not_found",
        "backend_unavailable",
        "path_outside_workspace",
        "not_found",
        "patch_rejected",
        "invalid_argument",
        "timeout",
        "conflict",
        "workspace_stopped",
      ]),
    );
  });

  it("keeps no module-level state: two clients with different homes are independent", () => {
    const a = new sdk.Pyro({ home: "/tmp/pyro-a", env: {} });
    const b = new sdk.Pyro({ home: "/tmp/pyro-b", env: {} });
    expect(a.engine.paths.home).not.toBe(b.engine.paths.home);
    expect(a.engine.workspaces).not.toBe(b.engine.workspaces);
  });
});

/** The option objects' keys, per method: from the zod schemas the SDK checks calls against. */
function optionKeys(): [string, string][] {
  return Object.entries(SIGNATURES).flatMap(([method, params]) =>
    params.flatMap((p) => {
      const shape = (p.schema as { shape?: Record<string, unknown> }).shape;
      return shape ? Object.keys(shape).map((k): [string, string] => [`${method}(${p.name})`, k]) : [];
    }),
  );
}

describe("SDK option keys", () => {
  it("are camelCase in every method's schema (snake_case is the core's and the results' spelling)", () => {
    const keys = optionKeys();
    expect(keys.length).toBeGreaterThan(40);
    expect(keys.filter(([, k]) => !/^[a-z][a-zA-Z0-9]*$/.test(k))).toEqual([]);
    for (const k of ["timeoutSeconds", "maxOutputBytes", "memoryMib", "diskMib", "ttlSeconds", "seedPath"])
      expect(keys.map(([, key]) => key)).toContain(k);
  });

  it("each map to one core option key and back (the SDK renames in one place)", () => {
    const camel = (k: string) => k.replace(/_([a-z])/g, (_m, c: string) => c.toUpperCase());
    for (const [, k] of optionKeys()) expect(camel(snakeKey(k))).toBe(k);
    expect(snakeKey("allowHostCompat")).toBe("allow_host_compat");
  });
});

/**
 * The published declarations, built the way `npm run build` builds them (into a temporary
 * directory) and read back with the compiler: what an SDK user's editor sees.
 */
describe("the SDK's declarations (dist/sdk/*.d.ts)", () => {
  let out: string;
  let checker: ts.TypeChecker;
  let exported: Map<string, ts.Symbol>;
  let pyroDts: ts.SourceFile;

  beforeAll(() => {
    out = mkdtempSync(join(tmpdir(), "pyro-dts-"));
    const config = ts.getParsedCommandLineOfConfigFile(join(REPO_ROOT, "tsconfig.json"), undefined, {
      ...ts.sys,
      onUnRecoverableConfigFileDiagnostic: (d) => {
        throw new Error(ts.flattenDiagnosticMessageText(d.messageText, "\n"));
      },
    });
    if (!config) throw new Error("tsconfig.json did not parse");
    const options = { ...config.options, outDir: out, emitDeclarationOnly: true, sourceMap: false };
    const emitted = ts.createProgram([join(REPO_ROOT, "src", "sdk", "index.ts")], options).emit();
    expect(emitted.emitSkipped).toBe(false);
    const program = ts.createProgram([join(out, "sdk", "index.d.ts")], { ...options, noEmit: true });
    checker = program.getTypeChecker();
    const index = program.getSourceFile(join(out, "sdk", "index.d.ts"))!;
    exported = new Map(
      checker.getExportsOfModule(checker.getSymbolAtLocation(index)!).map((s) => [s.name, s]),
    );
    pyroDts = program.getSourceFile(join(out, "sdk", "pyro.d.ts"))!;
  }, 120_000);
  afterAll(() => rmSync(out, { recursive: true, force: true }));

  /** Each method of `Pyro` in pyro.d.ts with the text of its declared return type. */
  function methods(): [string, string][] {
    const cls = pyroDts.statements.find(ts.isClassDeclaration)!;
    return cls.members
      .filter(ts.isMethodDeclaration)
      .map((m) => [m.name.getText(pyroDts), m.type?.getText(pyroDts) ?? "(inferred)"]);
  }

  it("names every method's result: Promise<ExportedType>, never an inline object or any", () => {
    const ms = methods();
    expect(ms.length).toBe(Object.getOwnPropertyNames(sdk.Pyro.prototype).length - 1);
    for (const [method, type] of ms) {
      if (method === "close") {
        expect(type).toBe("Promise<void>");
        continue;
      }
      const name = /^Promise<([A-Z][A-Za-z]*)>$/.exec(type)?.[1];
      expect(name, `${method} returns ${type}`).toBeDefined();
      expect(exported.has(name!), `${name} (${method}) is exported from the package`).toBe(true);
    }
    expect(methods().find(([m]) => m === "prepare")?.[1]).toBe("Promise<PrepareResult>");
  });

  it("has no `any` anywhere in pyro.d.ts", () => {
    const anys: string[] = [];
    const visit = (n: ts.Node): void => {
      if (n.kind === ts.SyntaxKind.AnyKeyword) anys.push(n.parent.getText(pyroDts));
      ts.forEachChild(n, visit);
    };
    visit(pyroDts);
    expect(anys).toEqual([]);
    expect(readFileSync(join(out, "sdk", "pyro.d.ts"), "utf8")).not.toMatch(/:\s*any\b|<any>/);
  });

  /** Property names of a type, all the way down (arrays, unions, nested objects), and any `any`. */
  function walk(type: ts.Type, path: string, seen: Set<ts.Type>, found: { keys: string[]; anys: string[] }) {
    if (type.flags & ts.TypeFlags.Any) found.anys.push(path);
    if (seen.has(type)) return;
    seen.add(type);
    if (type.isUnion() || type.isIntersection()) {
      for (const t of type.types) walk(t, path, seen, found);
      return;
    }
    if (checker.isArrayType(type)) {
      walk(checker.getTypeArguments(type as ts.TypeReference)[0]!, `${path}[]`, seen, found);
      return;
    }
    if (!(type.flags & ts.TypeFlags.Object)) return;
    const index = checker.getIndexTypeOfType(type, ts.IndexKind.String);
    if (index) walk(index, `${path}[key]`, seen, found);
    for (const p of checker.getPropertiesOfType(type)) {
      found.keys.push(`${path}.${p.name}`);
      const decl = p.valueDeclaration ?? p.declarations?.[0];
      if (decl) walk(checker.getTypeOfSymbolAtLocation(p, decl), `${path}.${p.name}`, seen, found);
    }
  }

  const RESULT_TYPES = [
    "DemoResult",
    "CommitResult",
    "DiffResult",
    "DoctorReport",
    "EnvironmentInfo",
    "EnvironmentList",
    "ExecResult",
    "ExportResult",
    "FileListResult",
    "FileReadResult",
    "FileWriteResult",
    "LogsResult",
    "PatchResult",
    "PrepareResult",
    "PruneResult",
    "PullResult",
    "ResetResult",
    "RunResult",
    "SnapshotDeleteResult",
    "SnapshotList",
    "SnapshotView",
    "SyncPushResult",
    "WorkspaceDeleteResult",
    "WorkspaceList",
    "WorkspaceListItem",
    "WorkspaceSummary",
    "WorkspaceView",
  ];
  const OPTION_TYPES = [
    "CommitOptions",
    "CreateWorkspaceOptions",
    "DemoOptions",
    "DoctorOptions",
    "ExecOptions",
    "ExportOptions",
    "ListFilesOptions",
    "LogsOptions",
    "PrepareOptions",
    "PruneOptions",
    "PullOptions",
    "ReadFileOptions",
    "RunOptions",
    "SnapshotOptions",
    "SyncPushOptions",
    "UpdateWorkspacePatch",
  ];

  function declared(name: string): ts.Type {
    const symbol = exported.get(name);
    if (!symbol) throw new Error(`${name} is not exported`);
    return checker.getDeclaredTypeOfSymbol(
      symbol.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(symbol) : symbol,
    );
  }

  it("exports every result type, each snake_case all the way down and free of any", () => {
    for (const name of RESULT_TYPES) {
      const found = { keys: [] as string[], anys: [] as string[] };
      walk(declared(name), name, new Set(), found);
      expect(found.keys.length, `${name} has fields`).toBeGreaterThan(0);
      expect(found.anys, `${name} has no any`).toEqual([]);
      expect(
        found.keys.filter((k) => !/^[a-z][a-z0-9_]*$/.test(k.slice(k.lastIndexOf(".") + 1))),
        `${name}'s fields are snake_case`,
      ).toEqual([]);
    }
  });

  it("exports every option type, with camelCase keys only", () => {
    for (const name of OPTION_TYPES) {
      const keys = checker.getPropertiesOfType(declared(name)).map((p) => p.name);
      expect(keys.length, name).toBeGreaterThan(0);
      expect(
        keys.filter((k) => !/^[a-z][a-zA-Z0-9]*$/.test(k)),
        name,
      ).toEqual([]);
    }
    expect(checker.getPropertiesOfType(declared("ExecOptions")).map((p) => p.name)).toEqual(
      expect.arrayContaining(["timeoutSeconds", "maxOutputBytes", "onOutput"]),
    );
  });
});
