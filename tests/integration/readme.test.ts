import { spawnSync } from "node:child_process";
import { realpathSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, symlink } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isRoot, REPO_ROOT } from "../helpers/cli.js";
import { ENV_CACHE, envCacheSkipReason } from "../helpers/sandbox.js";

/**
 * The README's examples, run as written: the quick start after `./scripts/setup`, and the
 * "From a shell" block line by line in bash with `set -e`. A new user pastes these; if
 * one of them fails, so does this test. `pyro` is this checkout's CLI, first on PATH,
 * as setup leaves it (the first test checks setup's link where setup ran).
 */
const README = join(REPO_ROOT, "README.md");
const skip = !isRoot
  ? "needs root (the default backend mounts overlays and creates cgroups)"
  : envCacheSkipReason();

/** The `pyro` the caller's PATH finds ("" when none). */
const onPathPyro = spawnSync("bash", ["-c", "command -v pyro"], { encoding: "utf8" }).stdout.trim();

/** The body of the first fenced `lang` block after `heading` in the README. */
async function block(heading: string, lang = "sh"): Promise<string> {
  const text = await readFile(README, "utf8");
  const at = text.indexOf(heading);
  if (at < 0) throw new Error(`README has no "${heading}"`);
  const open = text.indexOf(`\`\`\`${lang}\n`, at);
  const close = text.indexOf("\n```\n", open);
  return text.slice(open + lang.length + 4, close + 1);
}

describe.skipIf(skip !== "")(
  `the README's examples work literally${skip ? ` (skipped: ${skip})` : ""}`,
  () => {
    let root: string;
    let env: NodeJS.ProcessEnv;
    const bash = (script: string, timeout = 300_000) =>
      spawnSync("bash", ["-eo", "pipefail", "-c", script], {
        stdio: ["ignore", "pipe", "pipe"],
        cwd: root,
        env,
        encoding: "utf8",
        timeout,
      });

    beforeAll(async () => {
      root = await mkdtemp(join(tmpdir(), "pyro-readme-"));
      const bin = join(root, "bin");
      await mkdir(bin);
      await mkdir(join(root, "home"));
      await symlink(join(REPO_ROOT, "bin", "pyro.js"), join(bin, "pyro"));
      env = {
        PATH: `${bin}:${process.env.PATH ?? "/usr/bin:/bin"}`,
        HOME: join(root, "home"),
        // A fresh user in every respect but the environment cache (debian:12 is not rebuilt).
        PYRO_ENV_CACHE: ENV_CACHE,
        LANG: "C.UTF-8",
      };
    });
    afterAll(async () => {
      spawnSync(
        "bash",
        ["-c", "pyro workspace list --json >/dev/null; pyro workspace delete fix-bug >/dev/null 2>&1"],
        {
          env,
        },
      );
      await rm(root, { recursive: true, force: true });
    });

    it.skipIf(!onPathPyro)(
      `setup put \`pyro\` on PATH, linked to this checkout${onPathPyro ? "" : " (skipped: no pyro on PATH: scripts/setup has not run here)"}`,
      () => {
        expect(realpathSync(onPathPyro)).toBe(realpathSync(join(REPO_ROOT, "bin", "pyro.js")));
      },
    );

    it("quick start: the command after setup runs a sandbox and the demo", async () => {
      const quick = (await block("## Quick start")).trim();
      expect(quick.startsWith("./scripts/setup && ")).toBe(true);
      const r = bash(quick.slice("./scripts/setup && ".length));
      console.log(JSON.stringify(env), r.stderr);
      expect(r.status, r.stderr).toBe(0);
      expect(r.stdout).toMatch(/git version 2\./);
      expect(r.stderr).not.toMatch(/\n\s+at /);
    }, 300_000);

    it("'From a shell': every line, in a new directory", async () => {
      const script = await block("From a shell");
      const r = bash(script);
      expect(r.status, `${r.stdout}\n${r.stderr}`).toBe(0);
      expect(r.stdout).toContain("failed: exit 2"); // make's exit code for the failing test
      expect(r.stdout).toContain("ok\n"); // the test passes after the patch
      expect(r.stderr).not.toMatch(/\n\s+at /);
      const tryDir = join(root, "home", "pyro-try");
      expect(await readFile(join(tryDir, "dist-out", "calc.py"), "utf8")).toContain("return a + b");
      // The workspace is gone at the end, as the last line says.
      const list = spawnSync("bash", ["-c", "pyro workspace list --json"], { env, encoding: "utf8" });
      expect(JSON.parse(list.stdout).count).toBe(0);
    }, 300_000);

    it("'Network is off unless asked for': every line (the refused host is refused by name: nothing is dialled)", async () => {
      const r = bash(await block("Network is off unless asked for"));
      expect(r.status, `${r.stdout}\n${r.stderr}`).toBe(0);
      expect(r.stdout).toMatch(/^403\n/); // not in the allowlist
      expect(r.stdout).toContain("service http: ready");
      expect(r.stdout).toContain("Directory listing"); // python's http.server, through the published port
      expect(r.stdout).toContain("no blocks (network egress)");
      expect(r.stderr).not.toMatch(/\n\s+at /);
      const list = spawnSync("bash", ["-c", "pyro workspace list --json"], { env, encoding: "utf8" });
      expect(JSON.parse(list.stdout).count).toBe(0);
    }, 300_000);

    it("'An interactive shell': every line (the REPL's answer and the shell's kept state are read back)", async () => {
      const r = bash(await block("An interactive shell"));
      expect(r.status, `${r.stdout}\n${r.stderr}`).toBe(0);
      expect(r.stdout).toMatch(/^>>> print\(6 \* 7\)\n42$/m);
      expect(r.stdout).toMatch(/^\/tmp$/m);
      expect(r.stdout).not.toContain("\u001b");
      expect(r.stderr).not.toMatch(/\n\s+at /);
      const list = spawnSync("bash", ["-c", "pyro workspace list --json"], { env, encoding: "utf8" });
      expect(JSON.parse(list.stdout).count).toBe(0);
    }, 300_000);
  },
);
