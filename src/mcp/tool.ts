import type { ToolAnnotations } from "@modelcontextprotocol/sdk/types.js";
import type { z } from "zod";
import type { Engine } from "../core/engine.js";
import type { Workspaces } from "../core/workspaces.js";
import type { HostPathUse } from "./host-paths.js";
import type { ToolName } from "./profiles.js";
import type { Progress } from "./progress.js";
import type { DefaultSeed } from "./seed.js";

/** What every tool handler gets besides its arguments. One per call. */
export interface ToolContext {
  /**
   * The engine the tools call, as the CLI does: one translation from a tool's arguments
   * (already the core's snake_case) to a core call, never through the SDK's camelCase.
   */
  engine: Engine;
  /** The engine's workspace service (`engine.workspaces`). */
  ws: Workspaces;
  /** The default seed for creates without `seed_path`. */
  seed: DefaultSeed;
  /** The server was started with --allow-host-compat (passed through to creates and runs). */
  allowHostCompat: boolean;
  /**
   * Resolves a host path argument (seed_path, output_path, source_path) to the real path
   * to use, refusing anything outside the server's allowed directories (host-paths.ts).
   * Every host path an MCP tool takes must go through it.
   */
  hostPath(path: string, use: HostPathUse): Promise<string>;
  /** Fires when the client cancels the request (notifications/cancelled) or disconnects. */
  signal: AbortSignal;
  progress: Progress;
}

/**
 * One MCP tool: its name, a description written for a model (what it does, when to use
 * it rather than a neighbour, what to do next), strict input and loose output schemas,
 * annotations, the handler (which calls the core) and a short text rendering of the result.
 * Methods (not function properties) so that any definition is assignable to `ToolDefinition`.
 */
/** What a description may depend on: the server's tool set and default seed. */
export interface DescribeEnv {
  available: ReadonlySet<ToolName>;
  defaultSeed: string;
}

export interface ToolDefinition<I extends z.ZodObject = z.ZodObject, O extends z.ZodObject = z.ZodObject> {
  name: ToolName;
  title: string;
  /** What it does and when to use it rather than a neighbour. */
  description: string | ((env: DescribeEnv) => string);
  /** What to do next, as [tool, when]; only the tools the server exposes are mentioned. */
  next?: readonly (readonly [ToolName, string])[];
  input: I;
  /** The success result; the server also validates every success against it. */
  output: O;
  annotations: ToolAnnotations;
  /** Long-running: send heartbeat progress while it runs (when the client asked for progress). */
  long?: string;
  /** Typed against the output schema, so the compiler checks the core's results against it too. */
  run(args: z.output<I>, ctx: ToolContext): Promise<Declared<z.input<O>>>;
  /** Renders the validated result. */
  render(result: z.output<O>, args: z.output<I>): string;
}

/**
 * A schema's type without the `[key: string]: unknown` index signatures of loose objects:
 * the core's result types (which the SDK names) have none, yet must be checked against the
 * declared fields. (Loose objects are what let the core add fields without breaking a
 * client that validates results against the advertised schema.)
 */
export type Declared<T> = T extends readonly (infer U)[]
  ? Declared<U>[]
  : T extends object
    ? { [K in keyof T as string extends K ? never : K]: Declared<T[K]> }
    : T;

/** Identity helper that infers the generic parameters of a tool definition. */
export function defineTool<I extends z.ZodObject, O extends z.ZodObject>(
  tool: ToolDefinition<I, O>,
): ToolDefinition<I, O> {
  return tool;
}

/** `text` when the server offers `tool`, else "": a description names only tools that exist. */
export function ifOffered(env: DescribeEnv, tool: ToolName, text: string): string {
  return env.available.has(tool) ? text : "";
}

/** Joins description sentences, skipping empty ones. */
export function sentences(...parts: string[]): string {
  return parts.filter((p) => p !== "").join(" ");
}

/**
 * Annotation presets. `openWorldHint` is false unless a tool always reaches outside
 * (`openWorld`: an environment build fetches packages): workspaces have no network by default.
 */
export const READ_ONLY: ToolAnnotations = { readOnlyHint: true, openWorldHint: false };
export function mutating(o: {
  destructive: boolean;
  idempotent: boolean;
  openWorld?: boolean;
}): ToolAnnotations {
  return {
    readOnlyHint: false,
    destructiveHint: o.destructive,
    idempotentHint: o.idempotent,
    openWorldHint: o.openWorld ?? false,
  };
}
