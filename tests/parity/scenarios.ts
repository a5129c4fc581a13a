import { spawn, spawnSync } from "node:child_process";
import { mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "vitest";
import type { Pyro } from "../../src/sdk/pyro.js";
import { PYRO_BIN, REPO_ROOT } from "../helpers/cli.js";
import type { ParityTarget } from "./backends.js";
import { DISK_SCENARIOS } from "./disk.js";
import { EXEC_SCENARIOS } from "./exec.js";
import { FILE_SCENARIOS } from "./files.js";
import { GIT_SCENARIOS } from "./git.js";
import { NETWORK_SCENARIOS } from "./network.js";
import { SERVICE_SCENARIOS } from "./services.js";
import { SHELL_SCENARIOS } from "./shells.js";
import { SNAPSHOT_SCENARIOS } from "./snapshots.js";
import { withWorkspace } from "./util.js";

/**
 * The backend parity scenarios: one list, run against every backend (see parity.test.ts).
 * Each uses structured SDK results only. `real` scenarios need a sandbox that other
 * processes can reach (the in-process fake cannot be).
 */
export interface ScenarioContext {
  target: ParityTarget;
  pyro: Pyro;
  home: string;
  cliEnv: NodeJS.ProcessEnv;
  /** Create options every workspace of this backend needs. */
  createOptions: { backend: ParityTarget["backend"]; allowHostCompat?: boolean; seedPath?: string };
  seed: string;
}

export interface Scenario {
  name: string;
  real?: boolean;
  run(ctx: ScenarioContext): Promise<void>;
}

export const SCENARIOS: Scenario[] = [
  ...EXEC_SCENARIOS,
  ...FILE_SCENARIOS,
  ...SNAPSHOT_SCENARIOS,
  {
    name: "secrets (literal, ${HOST_VAR}, prompted) and forwarded env reach commands and are redacted",
    run: (ctx) =>
      withWorkspace(
        ctx,
        async (id) => {
          const p = ctx.pyro;
          const r = await p.execWorkspace(id, 'echo "$LIT $HOSTV $ASKED $FWD"');
          expect(r.stdout).toBe("[REDACTED:LIT] [REDACTED:HOSTV] [REDACTED:ASKED] forwarded-value\n");
          expect(
            (
              await p.execWorkspace(
                id,
                '[ "$LIT" = literal-secret ] && [ "$HOSTV" = from-the-host-env ] && [ "$ASKED" = asked-secret ]',
              )
            ).exit_code,
          ).toBe(0);
          expect(JSON.stringify(await p.workspaceLogs(id))).not.toMatch(
            /literal-secret|from-the-host-env|asked-secret/,
          );
          expect(JSON.stringify(await p.summarizeWorkspace(id))).not.toMatch(
            /literal-secret|from-the-host-env|asked-secret/,
          );
        },
        {
          secrets: { LIT: "literal-secret", HOSTV: "${PARITY_HOST_VAR}", ASKED: "?" },
          env: { FWD: "forwarded-value" },
          promptSecret: async () => "asked-secret",
        },
      ),
  },
  {
    name: "a prompted secret typed into a pseudo-terminal reaches commands",
    real: true,
    run: async (ctx) => {
      // `script` gives the CLI a real pty; what we write to its stdin is typed at the
      // prompt, once the prompt is shown (as a person would).
      const flags = [
        `--backend ${ctx.createOptions.backend}`,
        ctx.createOptions.allowHostCompat ? "--allow-host-compat" : "",
      ].join(" ");
      const cmd = `${process.execPath} ${PYRO_BIN} workspace create debian:12 ${flags} --secret TYPED=? --id-only`;
      const child = spawn("script", ["-qec", cmd, "/dev/null"], {
        env: { ...process.env, ...ctx.cliEnv },
        stdio: ["pipe", "pipe", "pipe"],
      });
      let out = "";
      let typed = false;
      child.stdout.on("data", (d: Buffer) => {
        out += d.toString();
        if (!typed && out.includes("TYPED: ")) {
          typed = true;
          child.stdin.write("typed-at-the-prompt\r");
        }
      });
      await new Promise((r) => child.on("close", r));
      const id = /ws_[0-9a-f]{12}/.exec(out)?.[0];
      expect(id, out).toBeDefined();
      expect(out).not.toContain("typed-at-the-prompt"); // no echo
      try {
        expect(
          (await ctx.pyro.execWorkspace(id!, '[ "$TYPED" = typed-at-the-prompt ] && echo "$TYPED"')).stdout,
        ).toBe("[REDACTED:TYPED]\n");
      } finally {
        await ctx.pyro.deleteWorkspace(id!);
      }
      const noTty = spawnSync(
        process.execPath,
        [PYRO_BIN, "workspace", "create", ...flags.split(" ").filter(Boolean), "--secret", "X=?", "--json"],
        { env: { ...process.env, ...ctx.cliEnv }, encoding: "utf8", input: "" },
      );
      expect(noTty.status).toBe(1);
      expect(JSON.parse(noTty.stdout).error.code).toBe("invalid_argument");
    },
  },
  {
    name: "resume: the creating process is killed, another process finds the workspace and its files",
    real: true,
    run: async (ctx) => {
      const script = `
        import { Pyro } from ${JSON.stringify(join(REPO_ROOT, "dist/sdk/index.js"))};
        const p = new Pyro();
        const w = await p.createWorkspace(${JSON.stringify({ backend: ctx.createOptions.backend, allowHostCompat: ctx.createOptions.allowHostCompat === true })});
        await p.writeWorkspaceFile(w.workspace_id, "made-by-creator.txt", "survives\\n");
        process.stdout.write(w.workspace_id + "\\n");
        setInterval(() => {}, 1000);
      `;
      const child = spawn(process.execPath, ["--input-type=module", "-e", script], {
        env: { ...process.env, ...ctx.cliEnv },
        stdio: ["ignore", "pipe", "inherit"],
      });
      const id = await new Promise<string>((resolve, reject) => {
        let out = "";
        child.stdout.on("data", (d: Buffer) => {
          out += d.toString();
          const m = /ws_[0-9a-f]{12}/.exec(out);
          if (m) resolve(m[0]);
        });
        child.on("exit", (c) => reject(new Error(`creator exited early (${c})`)));
      });
      child.kill("SIGKILL");
      await new Promise((r) => child.on("close", r));
      try {
        expect((await ctx.pyro.getWorkspace(id)).state).toBe("running");
        expect((await ctx.pyro.execWorkspace(id, "cat made-by-creator.txt")).stdout).toBe("survives\n");
      } finally {
        await ctx.pyro.deleteWorkspace(id);
      }
    },
  },
];

SCENARIOS.push(...NETWORK_SCENARIOS);
SCENARIOS.push(...SERVICE_SCENARIOS);
SCENARIOS.push(...SHELL_SCENARIOS);
SCENARIOS.push(...GIT_SCENARIOS);
SCENARIOS.push(...DISK_SCENARIOS);

/** The seed every scenario starts from. */
export async function makeSeed(): Promise<string> {
  const seed = await mkdtemp(join(tmpdir(), "pyro-parity-seed-"));
  await writeFile(join(seed, "app.py"), "print('hello')\n");
  const { chmod, mkdir, symlink } = await import("node:fs/promises");
  await mkdir(join(seed, "src"));
  await writeFile(join(seed, "src", "lib.txt"), "one\ntwo\n");
  // A symlink and an executable, so seeding, listings and resets are seen to keep both.
  await symlink("app.py", join(seed, "link"));
  await mkdir(join(seed, "bin"));
  await writeFile(join(seed, "bin", "run.sh"), "#!/bin/sh\necho run\n");
  await chmod(join(seed, "bin", "run.sh"), 0o755);
  return seed;
}
