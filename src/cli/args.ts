import { PyroError } from "../errors.js";
import { BACKEND_NAMES, type BackendName } from "../names.js";

/** commander collector for repeatable options. */
export function collect(value: string, previous: string[] = []): string[] {
  return [...previous, value];
}

/** Parses repeated K=V options into an object; a missing '=' is a usage error. */
export function keyValues(items: string[] | undefined, what: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const item of items ?? []) {
    const i = item.indexOf("=");
    if (i <= 0) throw new PyroError("invalid_argument", `${what} must look like KEY=VALUE, got '${item}'`);
    out[item.slice(0, i)] = item.slice(i + 1);
  }
  return out;
}

/** A parser for a positive number option (`--timeout 2.5`); Infinity and NaN are refused. */
export function positiveNumber(name: string) {
  return (value: string): number => {
    const n = value.trim() === "" ? Number.NaN : Number(value);
    if (!Number.isFinite(n) || n <= 0)
      throw new PyroError("invalid_argument", `${name} must be a positive number, got '${value}'`);
    return n;
  };
}

/** A parser for a whole-number option (`--vcpus 2`, `--memory 512`). */
export function wholeNumber(name: string) {
  return (value: string): number => {
    const n = /^\s*\d+\s*$/.test(value) ? Number(value) : Number.NaN;
    if (!Number.isSafeInteger(n) || n <= 0)
      throw new PyroError("invalid_argument", `${name} must be a whole number above 0, got '${value}'`);
    return n;
  };
}

export function backendName(value: string | undefined): BackendName | undefined {
  if (value === undefined) return undefined;
  if (!(BACKEND_NAMES as readonly string[]).includes(value)) {
    throw new PyroError(
      "invalid_argument",
      `unknown backend '${value}'`,
      `backends: ${BACKEND_NAMES.join(", ")}`,
    );
  }
  return value as BackendName;
}

/**
 * The command after `--`: one argument is a shell command string (`"make test && ls"`);
 * several are an argv, each word quoted for `/bin/sh -c` so nothing is re-split.
 */
export function commandString(argv: string[]): string {
  if (argv.length === 0)
    throw new PyroError(
      "invalid_argument",
      "no command given",
      "put the command after --, e.g. `-- git --version`",
    );
  if (argv.length === 1) return argv[0]!;
  return argv.map(shellQuote).join(" ");
}

export function shellQuote(word: string): string {
  if (/^[A-Za-z0-9_@%+=:,./-]+$/.test(word)) return word;
  return `'${word.replace(/'/g, `'\\''`)}'`;
}
