import { PyroError } from "../../src/errors.js";
import type { Harness } from "./sandbox.js";

/** How the last `kind` event of `id` went: `tar` (GNU tar on both sides) or `agent`. */
export function lastVia(h: Harness, id: string, kind: "export" | "sync_push"): string | undefined {
  const last = h.pyro.engine
    .store()
    .listEvents(id)
    .filter((e) => e.kind === kind)
    .at(-1);
  return (last?.detail as { via?: string } | undefined)?.via;
}

/** What `p` was refused with (`{code, message}` of its PyroError), or null when it succeeded. */
export function refusalOf(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    () => null,
    (err: unknown) => (err instanceof PyroError ? { code: err.code, message: err.message } : err),
  );
}
