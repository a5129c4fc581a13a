import * as z from "zod/mini";
import "../agent/zod.js";
import { PyroError } from "../errors.js";
import type { SandboxState } from "./backend.js";

/**
 * Typed sandbox state. A backend's state is persisted in the state store as JSON and read
 * back by any later process, so it is validated on the way in, never cast: `read` for a
 * state the backend needs whole (connect, isRunning), `readPartial` for cleanup paths
 * that must work with what is there (stop after a half-recorded start). zod's mini build
 * (as the agent's schemas, agent/zod.ts): every start, connect and one-shot of a backend
 * reads or writes state, and the classic build is ~400 KB compiled at its first import.
 */
export interface StateReader<T> {
  read(state: SandboxState): T;
  readPartial(state: SandboxState): Partial<T>;
}

export function stateReader<S extends z.core.$ZodLooseShape>(
  backend: string,
  shape: S,
): StateReader<z.output<z.ZodMiniObject<S>>> {
  const whole = z.looseObject(shape);
  return {
    read(state) {
      const parsed = whole.safeParse(state);
      if (!parsed.success)
        throw new PyroError(
          "internal",
          `the recorded ${backend} sandbox state is incomplete (${parsed.error.issues.map((i) => i.path.join(".")).join(", ")})`,
          "stop and start the workspace to record a fresh one",
        );
      return parsed.data as z.output<z.ZodMiniObject<S>>;
    },
    readPartial(state) {
      // Keep each field that is valid on its own; drop the rest.
      const out: Record<string, unknown> = {};
      for (const [k, schema] of Object.entries(shape)) {
        const r = z.safeParse(schema as z.ZodMiniType, (state as Record<string, unknown>)[k]);
        if (r.success && r.data !== undefined) out[k] = r.data;
      }
      return out as Partial<z.output<z.ZodMiniObject<S>>>;
    },
  };
}

/** The process of a sandbox: its pid and start time (safe against pid reuse). */
export const processShape = {
  pid: z.int().check(z.positive()),
  start_time: z.string().check(z.minLength(1)),
};

/** A Linux sandbox (bwrap, gVisor) whose agent listens on a host unix socket. */
export const socketSandboxShape = {
  ...processShape,
  socket: z.string().check(z.minLength(1)),
  log: z.string(),
  cgroup: z.string().check(z.minLength(1)),
};
/** What {@link socketSandboxShape} reads. */
export type SocketSandbox = z.output<z.ZodMiniObject<typeof socketSandboxShape>>;
