/**
 * Where the key that encrypts workspace secrets lives: never beside what it protects.
 * A copy of `$PYRO_HOME` (a backup, a tarball sent with a bug report, a synced cache
 * directory) carries the encrypted secrets but not their key.
 *
 * One key per user, found in this order:
 *   1. `PYRO_SECRET_KEY_FILE`: an explicit file (made 0600 on first use). Nothing else is
 *      consulted, so a user who set it knows exactly where the key is.
 *   2. The desktop keyring (freedesktop Secret Service, e.g. GNOME Keyring or KWallet),
 *      through libsecret's `secret-tool`, when it is installed and a session bus is
 *      there. A keyring that does not answer is treated as absent.
 *   3. `${XDG_CONFIG_HOME:-~/.config}/pyro/secrets.key` (0600 in a 0700 directory): not
 *      in `$PYRO_HOME`, which defaults to the cache directory.
 * An existing key wins over making one: a key already in the default file keeps being
 * used when a keyring appears later, so nothing encrypted becomes unreadable.
 *
 * Everything here is synchronous: the state store redacts secrets inside its write
 * transactions (src/state/store.ts), which cannot await. The keyring is asked at most
 * once per process.
 */
import { execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import {
  accessSync,
  chmodSync,
  closeSync,
  constants,
  fsyncSync,
  linkSync,
  openSync,
  readFileSync,
  rmSync,
  writeSync,
} from "node:fs";
import { homedir } from "node:os";
import { delimiter, dirname, join, resolve } from "node:path";
import { PyroError } from "../errors.js";
import { makeDirsSync } from "../util/fs.js";
import { configValue } from "./config.js";

export const KEY_BYTES = 32;

/** One place a key can be kept. */
export interface KeyStore {
  /** Where, for messages and `pyro doctor` (never the key itself). */
  readonly location: string;
  /** The key, or null when this store holds none. Throws when the store cannot be read. */
  read(): Buffer | null;
  /**
   * Stores `key` unless the store already holds one; returns the key the store holds
   * afterwards (another process may have won the race).
   */
  create(key: Buffer): Buffer;
}

/** A key in a file: 32 raw bytes, mode 0600, made with an exclusive link (no lost race). */
export class FileKeyStore implements KeyStore {
  constructor(readonly location: string) {}

  read(): Buffer | null {
    let key: Buffer;
    try {
      key = readFileSync(this.location);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw new PyroError(
        "internal",
        `cannot read the secrets key ${this.location}: ${(err as Error).message}`,
      );
    }
    if (key.length !== KEY_BYTES)
      throw new PyroError(
        "internal",
        `the secrets key ${this.location} is not a key (${key.length} bytes, expected ${KEY_BYTES})`,
        "restore the file, or point PYRO_SECRET_KEY_FILE at the right one",
      );
    return key;
  }

  create(key: Buffer): Buffer {
    const dir = dirname(this.location);
    makeDirsSync(dir, 0o700);
    const tmp = `${this.location}.${process.pid}.${randomBytes(4).toString("hex")}.tmp`;
    const fd = openSync(tmp, "wx", 0o600);
    try {
      writeSync(fd, key);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    try {
      // link(2) fails if the name exists: exactly one process makes the key.
      linkSync(tmp, this.location);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    } finally {
      rmSync(tmp, { force: true });
    }
    chmodSync(this.location, 0o600);
    return this.read() ?? key;
  }
}

/** The freedesktop Secret Service through libsecret's `secret-tool`. */
export class SecretServiceKeyStore implements KeyStore {
  readonly location = "the desktop keyring (Secret Service: service=pyro-mcp key=secrets)";
  private static readonly ATTRS = ["service", "pyro-mcp", "key", "secrets"];

  constructor(
    private readonly tool: string,
    private readonly env: NodeJS.ProcessEnv,
  ) {}

  read(): Buffer | null {
    let out: string;
    try {
      out = execFileSync(this.tool, ["lookup", ...SecretServiceKeyStore.ATTRS], {
        env: this.env,
        encoding: "utf8",
        stdio: ["ignore", "pipe", "pipe"],
        timeout: 10_000,
      });
    } catch (err) {
      const e = err as { status?: number | null; stderr?: string };
      // `lookup` exits 1 with nothing on stderr when the item does not exist.
      if (e.status === 1 && !e.stderr?.trim()) return null;
      throw new PyroError(
        "internal",
        `the desktop keyring did not answer: ${e.stderr?.trim() || String(err)}`,
      );
    }
    const key = Buffer.from(out.trim(), "base64");
    if (key.length !== KEY_BYTES)
      throw new PyroError("internal", "the keyring's pyro-mcp secrets item is not a key");
    return key;
  }

  create(key: Buffer): Buffer {
    const existing = this.read();
    if (existing) return existing;
    execFileSync(
      this.tool,
      ["store", "--label=pyro-mcp workspace secrets key", ...SecretServiceKeyStore.ATTRS],
      {
        env: this.env,
        input: key.toString("base64"),
        stdio: ["pipe", "ignore", "pipe"],
        timeout: 10_000,
      },
    );
    return this.read() ?? key;
  }
}

/** A short, non-secret name of a key, stored beside what it encrypted. */
export function keyId(key: Buffer): string {
  return createHash("sha256").update("pyro-mcp secrets key id\0").update(key).digest("hex").slice(0, 16);
}

function onPath(name: string, env: NodeJS.ProcessEnv): string | null {
  for (const dir of (env.PATH ?? "").split(delimiter)) {
    if (!dir) continue;
    const p = join(dir, name);
    try {
      accessSync(p, constants.X_OK);
      return p;
    } catch {
      // not here
    }
  }
  return null;
}

/** The default key file: `${XDG_CONFIG_HOME:-~/.config}/pyro/secrets.key`. */
export function defaultKeyFile(env: NodeJS.ProcessEnv): string {
  const config = env.XDG_CONFIG_HOME || join(env.HOME || homedir(), ".config");
  return resolve(config, "pyro", "secrets.key");
}

/** The key files this environment could use (to keep them out of seeds and exports). */
export function secretKeyPaths(env: NodeJS.ProcessEnv): string[] {
  const file = configValue(env, "PYRO_SECRET_KEY_FILE");
  return file ? [resolve(file)] : [defaultKeyFile(env)];
}

/**
 * The stores to consult, most preferred first (see the module comment). The keyring is
 * listed only when it answers.
 */
export function keyStores(env: NodeJS.ProcessEnv): KeyStore[] {
  const file = configValue(env, "PYRO_SECRET_KEY_FILE");
  if (file) return [new FileKeyStore(resolve(file))];
  const stores: KeyStore[] = [];
  const tool = env.DBUS_SESSION_BUS_ADDRESS ? onPath("secret-tool", env) : null;
  if (tool) {
    const keyring = new SecretServiceKeyStore(tool, env);
    try {
      keyring.read();
      stores.push(keyring);
    } catch {
      // No Secret Service on this bus (a headless session): the file it is.
    }
  }
  stores.push(new FileKeyStore(defaultKeyFile(env)));
  return stores;
}

/**
 * The user's secrets key: the first store that holds one, else a new key in the most
 * preferred store. `adopt` (a key found in an old layout) becomes the key when no store
 * holds one yet, so what it encrypted stays readable without re-encryption.
 */
export function userKey(stores: readonly KeyStore[], adopt?: Buffer): { key: Buffer; location: string } {
  for (const s of stores) {
    const key = s.read();
    if (key) return { key, location: s.location };
  }
  const first = stores[0];
  if (!first) throw new PyroError("internal", "no place to keep the secrets key");
  return { key: first.create(adopt ?? randomBytes(KEY_BYTES)), location: first.location };
}
