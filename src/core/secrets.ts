import { createCipheriv, createDecipheriv, randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { redactor } from "../state/redact.js";
import type { SecretRef } from "../state/types.js";
import { atomicWriteFile } from "../util/fs.js";
import { PyroError } from "./errors.js";

/**
 * Workspace secrets: `NAME=literal`, `NAME=${HOST_VAR}` (read from the host environment
 * at create; unset is an error), `NAME=?` (prompted on a terminal at create; refused
 * without one). Values reach every command as environment variables and are redacted
 * from command output, history, events, summaries and error messages.
 *
 * At rest: the state store keeps only names and reference kinds. Values are encrypted
 * with AES-256-GCM under a per-home key file (mode 0600) in the workspace's directory,
 * so a copied state database reveals nothing and a later process can still inject them.
 */
export type SecretPrompt = (name: string) => Promise<string>;

export interface ResolvedSecrets {
  refs: SecretRef[];
  values: Map<string, string>;
}

const NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** Parses `NAME=SPEC` strings (CLI) or a name→spec record (SDK, MCP) and resolves them. */
export async function resolveSecrets(
  specs: Record<string, string>,
  env: NodeJS.ProcessEnv,
  prompt: SecretPrompt | undefined,
): Promise<ResolvedSecrets> {
  const refs: SecretRef[] = [];
  const values = new Map<string, string>();
  for (const [name, spec] of Object.entries(specs)) {
    if (!NAME.test(name))
      throw new PyroError(
        "invalid_argument",
        `invalid secret name '${name}'`,
        "use letters, digits and _; not starting with a digit",
      );
    const hostVar = /^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$/.exec(spec)?.[1];
    if (hostVar) {
      const v = env[hostVar];
      if (v === undefined)
        throw new PyroError(
          "invalid_argument",
          `secret ${name}: host variable ${hostVar} is not set`,
          `export ${hostVar} first, or pass the value`,
        );
      refs.push({ name, kind: "host_env", host_var: hostVar });
      values.set(name, v);
    } else if (spec === "?") {
      if (!prompt) {
        throw new PyroError(
          "invalid_argument",
          `secret ${name} asks to be prompted, but there is no terminal`,
          `pass ${name}=\${HOST_VAR} or a literal instead`,
        );
      }
      refs.push({ name, kind: "prompt" });
      values.set(name, await prompt(name));
    } else {
      refs.push({ name, kind: "literal" });
      values.set(name, spec);
    }
  }
  return { refs, values };
}

/** Splits CLI `--secret NAME=SPEC` options. */
export function parseSecretOptions(items: readonly string[] | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const item of items ?? []) {
    const i = item.indexOf("=");
    if (i <= 0)
      throw new PyroError(
        "invalid_argument",
        "--secret must look like NAME=VALUE, NAME=${HOST_VAR} or NAME=?",
      );
    out[item.slice(0, i)] = item.slice(i + 1);
  }
  return out;
}

/** The per-home encryption key, created on first use with mode 0600. */
async function homeKey(home: string): Promise<Buffer> {
  const path = join(home, "secrets.key");
  try {
    const key = await readFile(path);
    if (key.length === 32) return key;
  } catch {
    // made below
  }
  const key = randomBytes(32);
  await atomicWriteFile(path, key, 0o600);
  // Another process may have won the race: use whatever is on disk now.
  return readFile(path);
}

export async function saveSecrets(home: string, file: string, values: Map<string, string>): Promise<void> {
  if (values.size === 0) return;
  const key = await homeKey(home);
  const iv = randomBytes(12);
  const cipher = createCipheriv("aes-256-gcm", key, iv);
  const ct = Buffer.concat([
    cipher.update(JSON.stringify(Object.fromEntries(values)), "utf8"),
    cipher.final(),
  ]);
  const blob = {
    v: 1,
    iv: iv.toString("base64"),
    tag: cipher.getAuthTag().toString("base64"),
    ct: ct.toString("base64"),
  };
  await atomicWriteFile(file, JSON.stringify(blob), 0o600);
}

export async function loadSecrets(home: string, file: string): Promise<Map<string, string>> {
  let blob: { iv: string; tag: string; ct: string };
  try {
    blob = JSON.parse(await readFile(file, "utf8"));
  } catch {
    return new Map();
  }
  try {
    const key = await readFile(join(home, "secrets.key"));
    const d = createDecipheriv("aes-256-gcm", key, Buffer.from(blob.iv, "base64"));
    d.setAuthTag(Buffer.from(blob.tag, "base64"));
    const text = Buffer.concat([d.update(Buffer.from(blob.ct, "base64")), d.final()]).toString("utf8");
    return new Map(Object.entries(JSON.parse(text) as Record<string, string>));
  } catch {
    throw new PyroError(
      "internal",
      "cannot decrypt this workspace's secrets",
      "the key file under PYRO_HOME was changed or removed; recreate the workspace",
    );
  }
}

/** A redactor for a workspace's secret values (identity when it has none). */
export function secretRedactor(values: Map<string, string>): (text: string) => string {
  return values.size === 0 ? (t) => t : redactor(values);
}
