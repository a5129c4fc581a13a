import { expect } from "vitest";
import type { PyroError } from "../../src/errors.js";
import type { Pyro } from "../../src/sdk/pyro.js";
import type { ScenarioContext } from "./scenarios.js";

/** The error code a call ends with, or "ok". */
export async function code(p: Promise<unknown>): Promise<string> {
  return p.then(
    () => "ok",
    (e: PyroError) => e.code,
  );
}

/** A workspace on the seed for one scenario, deleted after it whatever happens. */
export async function withWorkspace(
  ctx: ScenarioContext,
  fn: (id: string) => Promise<void>,
  extra: Parameters<Pyro["createWorkspace"]>[0] = {},
) {
  const w = await ctx.pyro.createWorkspace({ ...ctx.createOptions, seedPath: ctx.seed, ...extra });
  try {
    await fn(w.workspace_id);
  } finally {
    await ctx.pyro.deleteWorkspace(w.workspace_id).catch(() => {});
  }
}

/**
 * Whether commands run in a sandbox with a root of its own: not host-compat (the host's
 * root, a host directory for /workspace) nor the in-process fake (the same, without isolation).
 */
export function sandboxed(ctx: ScenarioContext): boolean {
  return ctx.target.real && ctx.target.backend !== "host";
}

/** Runs a command that must succeed and returns its stdout. */
export async function sh(pyro: Pyro, id: string, command: string): Promise<string> {
  const r = await pyro.execWorkspace(id, command);
  expect(r.exit_code, `workspace ${id}: \`${command}\` failed: ${r.stderr}`).toBe(0);
  return r.stdout;
}

/**
 * Entries /workspace holds on a backend beyond what was put there: qemu's /workspace is
 * the root of an ext4 disk, so mkfs's lost+found shows in listings and `ls -A` (the diff
 * leaves it out). A known divergence, spelled out so any other one still fails.
 */
export function fsRootExtras(ctx: ScenarioContext): string[] {
  return ctx.target.backend === "qemu" ? ["lost+found"] : [];
}

/** `ls -A | sort` of /workspace holding `names` (plus the backend's extras), as printed. */
export function lsOf(ctx: ScenarioContext, names: string[]): string {
  return [...names, ...fsRootExtras(ctx)]
    .sort()
    .map((n) => `${n}\n`)
    .join("");
}
