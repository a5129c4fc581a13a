import { readdir, readFile, stat } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { PyroError } from "../../../src/core/errors.js";
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
    env: { HOST_TOKEN: FROM_HOST, PYRO_BACKEND: "bwrap" },
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
    expect((await stat(join(t.home, "secrets.key"))).mode & 0o777).toBe(0o600);
  });

  it("keeps injecting secrets for a later client (resume), still redacted", async () => {
    const w = await pyro.createWorkspace({ secrets: { API_KEY: LITERAL } });
    await pyro.close();
    const later = new Pyro({
      home: t.home,
      environmentsDir: join(t.home, "envs"),
      builders: [new FakeBuilder()],
      backends: { bwrap: t.backend },
      env: { PYRO_BACKEND: "bwrap" },
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
