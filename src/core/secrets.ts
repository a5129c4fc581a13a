import { createCipheriv, createDecipheriv, randomBytes } from "node:crypto";
import { readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { PyroError } from "../errors.js";
import { redactor } from "../state/redact.js";
import type { SecretRef } from "../state/types.js";
import { type KeyStore, keyId, keyStores, userKey } from "./secret-key.js";

/**
 * Workspace secrets: `NAME=literal`, `NAME=${HOST_VAR}` (read from the host environment
 * at create; unset is an error), `NAME=?` (prompted on a terminal at create; refused
 * without one). Values reach every command as environment variables and are redacted
 * from command output, history, events, summaries and error messages.
 *
 * At rest: the state store keeps only names and reference kinds (and redacts values from
 * everything it stores). Values are encrypted with AES-256-GCM in the workspace's
 * directory under the user's key, which lives outside `$PYRO_HOME` (SecretVault,
 * src/core/secret-key.ts): a copied home reveals nothing, and a later process of the
 * same user can still inject them.
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

/** What `secrets.enc` holds: AES-256-GCM of the JSON name→value map. */
interface SecretBlob {
  /** 1: the old layout, key in `$PYRO_HOME/secrets.key`; 2: `kid` names the user key. */
  v: 1 | 2;
  kid?: string;
  iv: string;
  tag: string;
  ct: string;
}

function seal(key: Buffer, values: Map<string, string>): SecretBlob {
  const iv = randomBytes(12);
  const cipher = createCipheriv("aes-256-gcm", key, iv);
  const ct = Buffer.concat([
    cipher.update(JSON.stringify(Object.fromEntries(values)), "utf8"),
    cipher.final(),
  ]);
  return {
    v: 2,
    kid: keyId(key),
    iv: iv.toString("base64"),
    tag: cipher.getAuthTag().toString("base64"),
    ct: ct.toString("base64"),
  };
}

function open(key: Buffer, blob: SecretBlob): Map<string, string> {
  const d = createDecipheriv("aes-256-gcm", key, Buffer.from(blob.iv, "base64"));
  d.setAuthTag(Buffer.from(blob.tag, "base64"));
  const text = Buffer.concat([d.update(Buffer.from(blob.ct, "base64")), d.final()]).toString("utf8");
  return new Map(Object.entries(JSON.parse(text) as Record<string, string>));
}

function writeBlob(file: string, blob: SecretBlob): void {
  const tmp = `${file}.${process.pid}.${randomBytes(4).toString("hex")}.tmp`;
  writeFileSync(tmp, JSON.stringify(blob), { mode: 0o600, flush: true });
  renameSync(tmp, file);
}

/**
 * Encrypts and decrypts workspace secrets (`secrets.enc` in each workspace directory)
 * under the user's key, which lives outside `$PYRO_HOME` (src/core/secret-key.ts).
 *
 * The old layout kept the key in `$PYRO_HOME/secrets.key`. The first vault that opens
 * such a home migrates it: the old key becomes the user key when there is none yet
 * (nothing to re-encrypt), otherwise every `secrets.enc` of the home is re-encrypted
 * under the user key; then the old key file is removed. A migration cut short by a kill
 * leaves the old key in place and the next vault finishes it.
 */
export class SecretVault {
  private key: Buffer | null = null;

  private readonly stores: () => KeyStore[];

  constructor(
    private readonly home: string,
    env: NodeJS.ProcessEnv,
  ) {
    // Looked up on use, once per vault (the keyring is asked only when needed).
    let cached: KeyStore[] | null = null;
    this.stores = () => {
      cached ??= keyStores(env);
      return cached;
    };
  }

  private legacyKeyFile(): string {
    return join(this.home, "secrets.key");
  }

  /** The user's key, migrating an old home on first use. */
  private currentKey(): Buffer {
    if (this.key) return this.key;
    let legacy: Buffer | null = null;
    try {
      legacy = readFileSync(this.legacyKeyFile());
    } catch {
      // no old layout
    }
    if (legacy && legacy.length !== 32) legacy = null;
    const { key } = userKey(this.stores(), legacy ?? undefined);
    this.key = key;
    if (legacy) this.migrate(legacy, key);
    return key;
  }

  private migrate(legacy: Buffer, key: Buffer): void {
    if (!legacy.equals(key)) {
      const root = join(this.home, "workspaces");
      let ids: string[] = [];
      try {
        ids = readdirSync(root);
      } catch {
        // no workspaces
      }
      for (const id of ids) {
        const file = join(root, id, "secrets.enc");
        let blob: SecretBlob;
        try {
          blob = JSON.parse(readFileSync(file, "utf8")) as SecretBlob;
        } catch {
          continue;
        }
        if (blob.kid === keyId(key)) continue;
        try {
          writeBlob(file, seal(key, open(legacy, blob)));
        } catch {
          // Not the old key's (damaged, or someone else's): leave it as it is.
        }
      }
    }
    rmSync(this.legacyKeyFile(), { force: true });
  }

  save(file: string, values: Map<string, string>): void {
    if (values.size === 0) return;
    writeBlob(file, seal(this.currentKey(), values));
  }

  load(file: string): Map<string, string> {
    // The key first: finding it may migrate this very file (see the class comment).
    const key = this.currentKey();
    let blob: SecretBlob;
    try {
      blob = JSON.parse(readFileSync(file, "utf8")) as SecretBlob;
    } catch {
      return new Map();
    }
    try {
      return open(key, blob);
    } catch {
      const where = this.stores()
        .map((s) => s.location)
        .join(", or ");
      throw new PyroError(
        "internal",
        blob.kid && blob.kid !== keyId(key)
          ? `this workspace's secrets were encrypted under another key (id ${blob.kid}; the key in use is ${keyId(key)})`
          : "cannot decrypt this workspace's secrets",
        `the secrets key is kept in ${where}; restore the key this workspace was made with (PYRO_SECRET_KEY_FILE points at a key file), or recreate the workspace`,
      );
    }
  }
}

/** A redactor for a workspace's secret values (identity when it has none). */
export function secretRedactor(values: Map<string, string>): (text: string) => string {
  return values.size === 0 ? (t) => t : redactor(values);
}

/** An error whose message or hint may quote a secret (a failing command line, a path) is redacted. */
export function redactError(err: PyroError, secrets: Map<string, string>): PyroError {
  if (secrets.size === 0) return err;
  const redacted = err.withTexts(secretRedactor(secrets));
  return redacted.message === err.message && redacted.hint === err.hint ? err : redacted;
}

/**
 * The secret values of one client's workspaces: saved encrypted in each workspace's
 * directory (`fileOf`), decrypted once per client, with one redactor per workspace.
 * Synchronous, because the state store redacts inside its write transactions.
 */
export class WorkspaceSecrets {
  private readonly cache = new Map<string, Map<string, string>>();
  private readonly redactors = new Map<string, (text: string) => string>();
  private readonly vault: SecretVault;

  constructor(
    home: string,
    env: NodeJS.ProcessEnv,
    private readonly fileOf: (id: string) => string,
  ) {
    this.vault = new SecretVault(home, env);
  }

  /** Encrypts and saves a new workspace's values, and keeps them. */
  save(id: string, values: Map<string, string>): void {
    this.vault.save(this.fileOf(id), values);
    this.cache.set(id, values);
  }

  /** Workspace `id`'s values (none without secret refs; decrypted on first use). */
  values(id: string, refCount: number): Map<string, string> {
    if (refCount === 0) return new Map();
    let values = this.cache.get(id);
    if (!values) {
      values = this.vault.load(this.fileOf(id));
      this.cache.set(id, values);
    }
    return values;
  }

  /** The redactor of workspace `id`'s values. */
  redactor(id: string): (text: string) => string {
    let r = this.redactors.get(id);
    if (!r) {
      // The store asks only for workspaces that have secret refs.
      r = secretRedactor(this.values(id, 1));
      this.redactors.set(id, r);
    }
    return r;
  }

  /** Forgets a deleted workspace's values. */
  forget(id: string): void {
    this.cache.delete(id);
    this.redactors.delete(id);
  }
}
