import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import ts from "typescript";
import { PyroError } from "../../../src/errors.js";
import type { NewCommand, NewWorkspace } from "../../../src/state/types.js";

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");

/** A fresh temporary directory, removed by the returned cleanup. */
export function tempDir(prefix = "pyro-state-"): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** Runs `fn` and returns the PyroError it throws (failing the test if it does not). */
export function thrown(fn: () => unknown): PyroError {
  try {
    fn();
  } catch (err) {
    if (err instanceof PyroError) return err;
    throw err;
  }
  throw new Error("expected a PyroError");
}

/** A minimal valid workspace; override what the test cares about. */
export function sampleWorkspace(overrides: Partial<NewWorkspace> = {}): NewWorkspace {
  return {
    environment: "debian:12",
    backend: "bwrap",
    ttl_seconds: 3600,
    workspace_seed: { kind: "empty", source: null, file_count: 0, bytes: 0 },
    spec: { vcpus: 1, memory_mib: 1024, env: {}, timeout_seconds: 300 },
    ...overrides,
  };
}

export function sampleCommand(command: string, overrides: Partial<NewCommand> = {}): NewCommand {
  return {
    command,
    cwd: "/workspace",
    exit_code: 0,
    timed_out: false,
    duration_ms: 12,
    started_at: "2030-01-01T00:00:00.000Z",
    stdout_tail: "",
    stderr_tail: "",
    truncated: false,
    execution_mode: "guest_agent",
    ...overrides,
  };
}

/**
 * Child processes cannot load TypeScript, so the state module (and the one module it
 * imports at run time) is transpiled into a directory under node_modules/.cache: from
 * there Node resolves `better-sqlite3` through the project's node_modules. Returns the
 * file URL of the compiled store and a cleanup.
 */
export function compileStateModule(): { storeUrl: string; cleanup: () => void } {
  const cacheRoot = join(repoRoot, "node_modules", ".cache");
  mkdirSync(cacheRoot, { recursive: true });
  const out = mkdtempSync(join(cacheRoot, "pyro-state-test-"));
  writeFileSync(join(out, "package.json"), JSON.stringify({ type: "module" }));
  const sources = [
    ...readdirSync(join(repoRoot, "src/state"))
      .filter((f) => f.endsWith(".ts"))
      .map((f) => `state/${f}`),
    "errors.ts",
    "names.ts",
    "agent/errors.ts",
  ];
  for (const rel of sources) {
    const { outputText } = ts.transpileModule(readFileSync(join(repoRoot, "src", rel), "utf8"), {
      compilerOptions: {
        module: ts.ModuleKind.ESNext,
        target: ts.ScriptTarget.ES2022,
        esModuleInterop: true,
      },
    });
    const dest = join(out, rel.replace(/\.ts$/, ".js"));
    mkdirSync(dirname(dest), { recursive: true });
    writeFileSync(dest, outputText);
  }
  return {
    storeUrl: pathToFileURL(join(out, "state/store.js")).href,
    cleanup: () => rmSync(out, { recursive: true, force: true }),
  };
}
