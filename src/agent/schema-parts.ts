/**
 * Schema parts the op schemas share (op-schemas.ts, shell-schemas.ts): counts, paths and
 * environment variables as they travel in requests.
 */
import * as z from "zod/mini";
import "./zod.js";

export const count = z.int().check(z.minimum(0));
// Paths travel as strings; containment is the agent's job (guest/paths.ts), here we
// only refuse what can never be a path.
export const pathArg = z.string().check(z.refine((s) => !s.includes("\0"), "path must not contain NUL"));
export const envName = z
  .string()
  .check(z.regex(/^[^=\0]+$/, "environment variable names must be non-empty, without '=' or NUL"));
export const envValue = z
  .string()
  .check(z.refine((s) => !s.includes("\0"), "environment values must not contain NUL"));
