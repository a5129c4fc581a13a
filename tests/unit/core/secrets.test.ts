import { type ChildProcess, execFileSync, spawn, spawnSync } from "node:child_process";
import { createCipheriv, randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { SecretVault } from "../../../src/core/secrets.js";
import type { PyroError } from "../../../src/errors.js";
import { Pyro } from "../../../src/sdk/pyro.js";
import { fakePyro } from "../../helpers/engine.js";
import { FakeBuilder } from "../../helpers/fake-builder.js";

const LITERAL = "lit-s3cret-value";
const FROM_HOST = "host-s3cret-value";
const PROMPTED = "typed-s3cret-value";

let t: Awaited<ReturnType<typeof fakePyro>>;
let pyro: Pyro;
beforeEach(async () => {
  t = await fakePyro();
  await t.pyro.close();
  // The same home, with a host variable in the engine's environment.
  pyro = new Pyro({
    home: t.home,
    environmentsDir: join(t.home, "envs"),
    builders: [new FakeBuilder()],
    backends: { bwrap: t.backend },
    env: { HOST_TOKEN: FROM_HOST, PYRO_BACKEND: "bwrap", XDG_CONFIG_HOME: t.configHome },
  });
});
afterEach(async () => {
  await pyro.close();
  await t.cleanup();
});

async function grepHome(needle: string): Promise<string[]> {
  const hits: string[] = [];
  const walk = async (dir: string) => {
    for (const e of await readdir(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      if (e.isDirectory()) {
        if (!p.includes("/snapshots") && !p.includes("/envs")) await walk(p);
      } else if (e.isFile() && (await readFile(p)).includes(needle)) hits.push(p);
    }
  };
  await walk(t.home);
  return hits;
}

/** Files of the state database (with its WAL) that contain `needle`. */
async function grepDb(needle: string): Promise<string[]> {
  const hits: string[] = [];
  for (const f of ["state.db", "state.db-wal"]) {
    const p = join(t.home, f);
    if (existsSync(p) && (await readFile(p)).includes(needle)) hits.push(f);
  }
  return hits;
}

/** Whether a real Secret Service can be started here (setup installs GNOME Keyring and secret-tool). */
const keyringSkipReason = (() => {
  for (const tool of ["secret-tool", "gnome-keyring-daemon", "dbus-daemon"]) {
    if (spawnSync("sh", ["-c", `command -v ${tool}`]).status !== 0)
      return { ok: false, why: `${tool} is not installed (scripts/setup installs it)` };
  }
  return { ok: true, why: "" };
})();

/**
 * A private session bus with an unlocked GNOME Keyring on it, its files under `dir`.
 * Returns the environment that reaches it.
 */
async function startKeyring(dir: string): Promise<{ env: NodeJS.ProcessEnv; stop: () => void }> {
  const home = join(dir, "keyring-home");
  await mkdir(home, { recursive: true });
  // The bus gets the test's home too: a client that calls before our daemon has claimed
  // its name makes the bus activate another gnome-keyring-daemon (D-Bus activation), which
  // inherits the bus's environment. With the caller's HOME it would serve the caller's
  // keyrings, where the test's login collection does not exist (a load-dependent failure).
  const busEnv = { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: home, XDG_DATA_HOME: join(home, "data") };
  const bus: ChildProcess = spawn("dbus-daemon", ["--session", "--nofork", "--print-address=1"], {
    stdio: ["ignore", "pipe", "ignore"],
    env: busEnv,
  });
  const address = await new Promise<string>((resolve, reject) => {
    let out = "";
    bus.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
      if (out.includes("\n")) resolve(out.trim());
    });
    bus.once("exit", () => reject(new Error("dbus-daemon exited")));
  });
  const env = { ...busEnv, DBUS_SESSION_BUS_ADDRESS: address };
  const keyringPids: number[] = [];
  // The login keyring exists before the daemon starts, as a plain-text keyring file (always
  // unlocked): with --unlock the daemon made it asynchronously, and on a loaded machine it
  // sometimes never appeared ("collection/login does not exist" for 10 s).
  await mkdir(join(home, "data", "keyrings"), { recursive: true });
  await writeFile(
    join(home, "data", "keyrings", "login.keyring"),
    "[keyring]\ndisplay-name=Login\nctime=0\nmtime=0\nlock-on-idle=false\nlock-after=false\n",
    { mode: 0o600 },
  );
  await writeFile(join(home, "data", "keyrings", "default"), "login");
  const out = execFileSync("gnome-keyring-daemon", ["--daemonize", "--components=secrets"], {
    env,
    encoding: "utf8",
  });
  const pid = /GNOME_KEYRING_PID=(\d+)/.exec(out)?.[1];
  if (pid) keyringPids.push(Number(pid));
  // The daemon answers before its login collection exists (it is made asynchronously;
  // on a busy machine a store right away fails with "collection/login does not exist"):
  // wait until a probe item can be stored, then remove it.
  const probe = ["pyro-test", "keyring-ready"];
  for (let i = 0; ; i++) {
    const r = spawnSync("secret-tool", ["store", "--label=probe", ...probe], {
      env,
      input: "x",
      timeout: 10_000,
    });
    if (r.status === 0) break;
    if (i >= 100) throw new Error(`the test keyring never became ready: ${String(r.stderr)}`);
    await new Promise((done) => setTimeout(done, 100));
  }
  spawnSync("secret-tool", ["clear", ...probe], { env, timeout: 10_000 });
  return {
    env,
    stop: () => {
      for (const p of keyringPids) {
        try {
          process.kill(p, "SIGTERM");
        } catch {
          // gone
        }
      }
      bus.kill("SIGTERM");
    },
  };
}

describe("secrets and forwarded env", () => {
  it("injects literal, host-variable and prompted secrets and redacts them everywhere", async () => {
    const asked: string[] = [];
    const w = await pyro.createWorkspace({
      secrets: { API_KEY: LITERAL, TOKEN: "${HOST_TOKEN}", PASSWORD: "?" },
      env: { MODE: "test" },
      promptSecret: async (name) => {
        asked.push(name);
        return PROMPTED;
      },
    });
    expect(asked).toEqual(["PASSWORD"]);
    expect(w.secrets).toEqual([
      { name: "API_KEY", kind: "literal" },
      { name: "TOKEN", kind: "host_env" },
      { name: "PASSWORD", kind: "prompt" },
    ]);
    const r = await pyro.execWorkspace(
      w.workspace_id,
      'echo "$API_KEY $TOKEN $PASSWORD $MODE"; echo "$API_KEY" >&2',
    );
    expect(r.stdout).toBe("[REDACTED:API_KEY] [REDACTED:TOKEN] [REDACTED:PASSWORD] test\n");
    expect(r.stderr).toBe("[REDACTED:API_KEY]\n");
    // The values were really there: a check that does not print them.
    const ok = await pyro.execWorkspace(
      w.workspace_id,
      `[ "$API_KEY" = "${LITERAL}" ] && [ "$TOKEN" = "${FROM_HOST}" ] && [ "$PASSWORD" = "${PROMPTED}" ]`,
    );
    expect(ok.exit_code).toBe(0);
    expect(ok.command).not.toContain(LITERAL);
    const logs = await pyro.workspaceLogs(w.workspace_id);
    expect(JSON.stringify(logs)).not.toMatch(/s3cret/);
    expect(JSON.stringify(await pyro.summarizeWorkspace(w.workspace_id))).not.toMatch(/s3cret/);
    // Never at rest in plain text: not in the state database (and its WAL), nor anywhere in the home.
    for (const v of [LITERAL, FROM_HOST, PROMPTED]) expect(await grepHome(v)).toEqual([]);
    const enc = join(pyro.engine.workspaces.workspaceDir(w.workspace_id), "secrets.enc");
    expect((await stat(enc)).mode & 0o777).toBe(0o600);
    // The key is not beside them: a copy of the home does not carry it.
    await expect(stat(join(t.home, "secrets.key"))).rejects.toThrow();
    expect((await stat(join(t.configHome, "pyro", "secrets.key"))).mode & 0o777).toBe(0o600);
    expect((await stat(join(t.configHome, "pyro"))).mode & 0o777).toBe(0o700);
  });

  it("keeps injecting secrets for a later client (resume), still redacted", async () => {
    const w = await pyro.createWorkspace({ secrets: { API_KEY: LITERAL } });
    await pyro.close();
    const later = new Pyro({
      home: t.home,
      environmentsDir: join(t.home, "envs"),
      builders: [new FakeBuilder()],
      backends: { bwrap: t.backend },
      env: { PYRO_BACKEND: "bwrap", XDG_CONFIG_HOME: t.configHome },
    });
    try {
      const r = await later.execWorkspace(w.workspace_id, 'printf %s "$API_KEY" | wc -c; echo "$API_KEY"');
      expect(r.stdout).toBe(`${LITERAL.length}\n[REDACTED:API_KEY]\n`);
    } finally {
      await later.close();
    }
  });

  it("refuses an unset host variable and a prompt without a terminal, creating nothing", async () => {
    const code = async (p: Promise<unknown>) =>
      p.then(
        () => "ok",
        (e: PyroError) => e.code,
      );
    expect(await code(pyro.createWorkspace({ secrets: { T: "${NOT_SET_ANYWHERE}" } }))).toBe(
      "invalid_argument",
    );
    expect(await code(pyro.createWorkspace({ secrets: { T: "?" } }))).toBe("invalid_argument");
    expect(await code(pyro.createWorkspace({ secrets: { "bad-name": "x" } }))).toBe("invalid_argument");
    expect((await pyro.listWorkspaces()).count).toBe(0);
  });
});

describe("secrets at rest: the key is kept apart from the home, values never reach the store", () => {
  it("keeps secret values out of every event and history row, even in paths and names", async () => {
    const w = await pyro.createWorkspace({ secrets: { API_KEY: LITERAL } });
    await pyro.writeWorkspaceFile(w.workspace_id, `notes-${LITERAL}.txt`, "x");
    await pyro
      .applyWorkspacePatch(
        w.workspace_id,
        `--- a/p-${LITERAL}.txt\n+++ b/p-${LITERAL}.txt\n@@ -0,0 +1 @@\n+y\n`,
      )
      .catch(() => {});
    await pyro.execWorkspace(w.workspace_id, `ls; echo ${LITERAL}`);
    const events = JSON.stringify(await pyro.workspaceLogs(w.workspace_id));
    expect(events).not.toContain(LITERAL);
    expect(await grepHome(LITERAL)).toEqual([]);
  });

  it("refuses to store history for a workspace with secrets when it cannot redact (fails closed)", async () => {
    const w = await pyro.createWorkspace({ secrets: { API_KEY: LITERAL } });
    const { StateStore } = await import("../../../src/state/store.js");
    const raw = StateStore.open(join(t.home, "state.db"));
    try {
      expect(() => raw.recordEvent(w.workspace_id, "update", { note: LITERAL })).toThrow(/redact/);
      expect(raw.listEvents(w.workspace_id).map((e) => e.kind)).not.toContain("update");
    } finally {
      raw.close();
    }
  });

  it("zeroes what a deleted workspace stored (secure_delete, WAL truncated)", async () => {
    const marker = "deleted-output-marker-7f3a";
    const w = await pyro.createWorkspace({});
    await pyro.execWorkspace(w.workspace_id, `for i in $(seq 50); do echo ${marker}-$i; done`);
    expect((await grepDb(marker)).length).toBeGreaterThan(0);
    await pyro.deleteWorkspace(w.workspace_id);
    expect(await grepDb(marker)).toEqual([]);
  });
});

describe("SecretVault: where the key lives", () => {
  const values = new Map([["API_KEY", LITERAL]]);
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), "pyro-vault-"));
    await mkdir(join(dir, "home", "workspaces", "ws_a"), { recursive: true });
  });
  afterEach(() => rm(dir, { recursive: true, force: true }));
  const file = () => join(dir, "home", "workspaces", "ws_a", "secrets.enc");

  it("a copy of the home alone cannot open its secrets", async () => {
    new SecretVault(join(dir, "home"), { XDG_CONFIG_HOME: join(dir, "cfg") }).save(file(), values);
    expect(new SecretVault(join(dir, "home"), { XDG_CONFIG_HOME: join(dir, "cfg") }).load(file())).toEqual(
      values,
    );
    const other = new SecretVault(join(dir, "home"), { XDG_CONFIG_HOME: join(dir, "elsewhere") });
    const err = (() => {
      try {
        other.load(file());
      } catch (e) {
        return e as PyroError;
      }
      return null;
    })();
    expect(err?.code).toBe("internal");
    expect(err?.message).toMatch(/another key/);
    expect(err?.hint).toMatch(/PYRO_SECRET_KEY_FILE/);
    expect(err?.message).not.toContain(LITERAL);
  });

  it("PYRO_SECRET_KEY_FILE names the key file, made 0600", async () => {
    const keyFile = join(dir, "keys", "pyro.key");
    const env = { PYRO_SECRET_KEY_FILE: keyFile, XDG_CONFIG_HOME: join(dir, "cfg") };
    new SecretVault(join(dir, "home"), env).save(file(), values);
    expect((await stat(keyFile)).mode & 0o777).toBe(0o600);
    expect((await stat(keyFile)).size).toBe(32);
    await expect(stat(join(dir, "cfg", "pyro", "secrets.key"))).rejects.toThrow();
    expect(new SecretVault(join(dir, "home"), env).load(file())).toEqual(values);
  });

  it("migrates the old layout (key in the home): adopts the key, or re-encrypts under the user's", async () => {
    // The old layout: a v1 blob beside $PYRO_HOME/secrets.key.
    const legacy = randomBytes(32);
    const oldBlob = () => {
      const iv = randomBytes(12);
      const c = createCipheriv("aes-256-gcm", legacy, iv);
      const ct = Buffer.concat([c.update(JSON.stringify({ API_KEY: LITERAL })), c.final()]);
      return JSON.stringify({
        v: 1,
        iv: iv.toString("base64"),
        tag: c.getAuthTag().toString("base64"),
        ct: ct.toString("base64"),
      });
    };
    const home = join(dir, "home");
    await writeFile(join(home, "secrets.key"), legacy, { mode: 0o600 });
    await writeFile(file(), oldBlob());
    // No user key yet: the old key becomes it.
    const env = { XDG_CONFIG_HOME: join(dir, "cfg") };
    expect(new SecretVault(home, env).load(file())).toEqual(values);
    await expect(stat(join(home, "secrets.key"))).rejects.toThrow();
    expect(await readFile(join(dir, "cfg", "pyro", "secrets.key"))).toEqual(legacy);

    // A user key already exists (another home migrated first): the blobs are re-encrypted.
    const env2 = { XDG_CONFIG_HOME: join(dir, "cfg2") };
    new SecretVault(join(dir, "other"), env2).save(join(dir, "probe.enc"), values);
    await writeFile(join(home, "secrets.key"), legacy, { mode: 0o600 });
    await writeFile(file(), oldBlob());
    expect(new SecretVault(home, env2).load(file())).toEqual(values);
    await expect(stat(join(home, "secrets.key"))).rejects.toThrow();
    expect(JSON.parse(await readFile(file(), "utf8")).v).toBe(2);
    // Readable with the user key alone now.
    expect(new SecretVault(home, env2).load(file())).toEqual(values);
  });

  it.skipIf(!keyringSkipReason.ok)(
    `keeps the key in the desktop keyring (real GNOME Keyring on a private session bus)${keyringSkipReason.ok ? "" : `: skipped, ${keyringSkipReason.why}`}`,
    async () => {
      const session = await startKeyring(dir);
      try {
        const env = { ...session.env, XDG_CONFIG_HOME: join(dir, "cfg") };
        new SecretVault(join(dir, "home"), env).save(file(), values);
        // Not in a file: in the keyring, where `secret-tool` finds it.
        await expect(stat(join(dir, "cfg", "pyro", "secrets.key"))).rejects.toThrow();
        const stored = execFileSync("secret-tool", ["lookup", "service", "pyro-mcp", "key", "secrets"], {
          env: session.env,
          encoding: "utf8",
        });
        expect(Buffer.from(stored.trim(), "base64").length).toBe(32);
        expect(new SecretVault(join(dir, "home"), env).load(file())).toEqual(values);
        // Without the keyring (another session), the secrets stay closed.
        expect(() =>
          new SecretVault(join(dir, "home"), { XDG_CONFIG_HOME: join(dir, "cfg") }).load(file()),
        ).toThrow(/another key/);
      } finally {
        session.stop();
      }
    },
    30_000,
  );
});
