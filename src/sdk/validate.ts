/**
 * The SDK's argument check: each argument of a `Pyro` call against its schema in
 * SIGNATURES, before anything else happens. A failure is one `invalid_argument`
 * PyroError: `method: argument.path problem, got VALUE`, with a hint saying what the
 * argument should be. Values are described, never dumped: a string is quoted up to 80
 * characters, an object by its keys, so a huge input cannot make a huge message.
 */
import type { z } from "zod";
import { PyroError } from "../errors.js";
import { type CheckedMethod, type Param, SIGNATURES } from "./schemas.js";

const QUOTE_CHARS = 80;
const KEY_CHARS = 40;

type Issue = z.core.$ZodIssue;

/** Throws `invalid_argument` for the first argument of `method` that does not fit its schema. */
export function checkArgs(method: CheckedMethod, args: readonly unknown[]): void {
  const params: readonly Param[] = SIGNATURES[method];
  params.forEach((param, i) => {
    const r = param.schema.safeParse(args[i]);
    const issue = r.error?.issues[0];
    if (issue) throw argumentError(method, params, param, args[i], issue);
  });
}

function argumentError(
  method: string,
  params: readonly Param[],
  param: Param,
  value: unknown,
  issue: Issue,
): PyroError {
  const where = pathText(param.name, issue.path);
  const got = valueAt(value, issue.path);
  const usage = `usage: ${method}(${params.map((p) => (p.optional ? `${p.name}?` : p.name)).join(", ")})`;
  const shape = objectShape(param.schema);
  if (issue.code === "unrecognized_keys") {
    const accepted = Object.keys(shape ?? {});
    const unknown = issue.keys.slice(0, 3).map((k) => quote(k, KEY_CHARS));
    const more = issue.keys.length > 3 ? ` and ${issue.keys.length - 3} more` : "";
    const guesses = [...new Set(issue.keys.flatMap((k) => accepted.filter((a) => loose(a) === loose(k))))];
    // The core's spelling (timeout_seconds, as the CLI's --json and MCP use) is the likely slip.
    const snake = issue.keys.some((k) => k.includes("_") && guesses.some((g) => loose(g) === loose(k)));
    return new PyroError(
      "invalid_argument",
      `${method}: ${where} has unknown key${issue.keys.length > 1 ? "s" : ""} ${unknown.join(", ")}${more}`,
      `${guesses.length > 0 ? `did you mean ${guesses.join(", ")}? ` : ""}${snake ? "SDK option keys are camelCase; " : ""}${where} takes: ${accepted.join(", ")}`,
    );
  }
  // An option object (or updateWorkspace's patch) that is not an object at all.
  const objectArg =
    shape === undefined || issue.path.length > 0 ? undefined : param.optional ? "optional" : "required";
  return new PyroError(
    "invalid_argument",
    `${method}: ${problem(where, issue, got, objectArg)}`,
    `${expectation(param, shape, issue.path)}${usage}`,
  );
}

/** What the argument, or the option its path starts with, should be: `options.cwd is ...; `. */
function expectation(
  param: Param,
  shape: Record<string, z.ZodType> | undefined,
  path: readonly PropertyKey[],
): string {
  if (!shape) return param.schema.description ? `${param.name} is ${param.schema.description}; ` : "";
  const key = path[0];
  if (key === undefined) return `${param.name} takes: ${Object.keys(shape).join(", ")}; `;
  const about = typeof key === "string" ? shape[key]?.description : undefined;
  return about ? `${pathText(param.name, [key])} is ${about}; ` : "";
}

/** `where` and what is wrong with it, ending with the value it got. */
function problem(
  where: string,
  issue: Issue,
  got: unknown,
  objectArg: "optional" | "required" | undefined,
): string {
  const value = describeValue(got);
  switch (issue.code) {
    case "invalid_type": {
      if (objectArg === "optional") return `${where} must be an object or undefined, got ${value}`;
      if (objectArg === "required") return `${where} must be an object, got ${value}`;
      if (issue.expected === "number" && typeof got === "number")
        return `${where} must be a finite number, got ${value}`;
      return `${where} must be ${EXPECTED[issue.expected] ?? `a ${issue.expected}`}, got ${value}`;
    }
    case "too_small":
      if (issue.origin === "string" && Number(issue.minimum) === 1) return `${where} must not be empty`;
      return `${where} must be ${bound(issue.origin, issue.minimum, issue.inclusive, "small")}, got ${value}`;
    case "too_big":
      return `${where} must be ${bound(issue.origin, issue.maximum, issue.inclusive, "big")}, got ${value}`;
    case "invalid_value":
      return `${where} must be one of ${issue.values.map((v) => String(v)).join(", ")}, got ${value}`;
    case "invalid_key": {
      const key = issue.path[issue.path.length - 1];
      const inner = issue.issues[0];
      const container = where.slice(0, where.length - pathSegment(key ?? "").length);
      const reason =
        inner?.code === "too_small" ? "keys must not be empty" : (inner?.message ?? "invalid key");
      return `${container} has an invalid key ${quote(String(key ?? ""), KEY_CHARS)}: ${reason}`;
    }
    case "invalid_format":
    case "custom":
      return `${where} ${issue.message}, got ${value}`;
    default:
      return `${where} is invalid (${issue.message}), got ${value}`;
  }
}

const EXPECTED: Record<string, string> = {
  string: "a string",
  number: "a number",
  int: "a whole number",
  boolean: "true or false",
  object: "an object",
  record: "an object",
  array: "an array",
};

function bound(
  origin: string,
  limit: unknown,
  inclusive: boolean | undefined,
  side: "small" | "big",
): string {
  const n = String(limit);
  if (origin === "string") return `${side === "small" ? "at least" : "at most"} ${n} characters long`;
  if (origin === "array") return `${side === "small" ? "at least" : "at most"} ${n} items long`;
  if (side === "small") return inclusive === false ? `greater than ${n}` : `at least ${n}`;
  return inclusive === false ? `less than ${n}` : `at most ${n}`;
}

/** `options.env["BAD KEY"]`: identifiers with dots, anything else in brackets, keys clipped. */
function pathText(name: string, path: readonly PropertyKey[]): string {
  return name + path.map(pathSegment).join("");
}

function pathSegment(key: PropertyKey): string {
  if (typeof key === "number") return `[${key}]`;
  const s = String(key);
  return /^[A-Za-z_$][A-Za-z0-9_$]*$/.test(s) && s.length <= KEY_CHARS ? `.${s}` : `[${quote(s, KEY_CHARS)}]`;
}

function valueAt(value: unknown, path: readonly PropertyKey[]): unknown {
  let v = value;
  for (const key of path) {
    if (v === null || (typeof v !== "object" && typeof v !== "function")) return undefined;
    v = (v as Record<PropertyKey, unknown>)[key];
  }
  return v;
}

/** A short description of any value: strings quoted and clipped, objects by their keys. */
export function describeValue(v: unknown): string {
  if (typeof v === "string") return quote(v, QUOTE_CHARS);
  if (typeof v === "number" || typeof v === "boolean" || v === undefined || v === null) return String(v);
  if (typeof v === "bigint") return `${clip(String(v), KEY_CHARS)}n`;
  if (typeof v === "symbol") return "a symbol";
  if (typeof v === "function") return "a function";
  if (Array.isArray(v)) return `an array of ${v.length} item${v.length === 1 ? "" : "s"}`;
  if (v instanceof Uint8Array) return `${article(v.constructor.name)} of ${v.length} bytes`;
  const proto = Object.getPrototypeOf(v) as { constructor?: { name?: unknown } } | null;
  const ctor = proto?.constructor?.name;
  if (typeof ctor === "string" && ctor !== "" && ctor !== "Object") return article(clip(ctor, KEY_CHARS));
  const keys = Object.keys(v as object);
  return keys.length === 0 ? "an empty object" : `an object {${clip(keys.join(", "), QUOTE_CHARS)}}`;
}

function quote(s: string, max: number): string {
  return s.length <= max ? JSON.stringify(s) : `${JSON.stringify(s.slice(0, max))}… (${s.length} characters)`;
}

function clip(s: string, max: number): string {
  return s.length <= max ? s : `${s.slice(0, max)}…`;
}

function article(noun: string): string {
  return `${/^[AEIOUaeiou]/.test(noun) ? "an" : "a"} ${noun}`;
}

/** `timeoutSeconds`, `timeout_seconds` and `timeoutseconds` are the same word. */
function loose(key: string): string {
  return key.replace(/_/g, "").toLowerCase();
}

function objectShape(schema: z.ZodType): Record<string, z.ZodType> | undefined {
  const shape = (schema as { shape?: unknown }).shape;
  return shape && typeof shape === "object" ? (shape as Record<string, z.ZodType>) : undefined;
}
