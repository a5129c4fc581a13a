import { spawn, spawnSync } from "node:child_process";
import { mkdtemp, readFile, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "vitest";
import type { PyroError } from "../../src/errors.js";
import type { Pyro } from "../../src/sdk/pyro.js";
import { PYRO_BIN, REPO_ROOT } from "../helpers/cli.js";
import type { ParityTarget } from "./backends.js";
import { DISK_SCENARIOS } from "./disk.js";
import { GIT_SCENARIOS } from "./git.js";
import { NETWORK_SCENARIOS } from "./network.js";
import { SERVICE_SCENARIOS } from "./services.js";
import { SHELL_SCENARIOS } from "./shells.js";

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

async function code(p: Promise<unknown>): Promise<string> {
  return p.then(
    () => "ok",
    (e: PyroError) => e.code,
  );
}

async function withWorkspace(
  ctx: ScenarioContext,
  fn: (id: string) => Promise<void>,
  extra: Parameters<Pyro["createWorkspace"]>[0] = {},
) {
  const w = await ctx.pyro.createWorkspace({ ...ctx.createOptions, seedPath: ctx.seed, ...extra });
  try {
    await fn(w.workspace_id);
  } finally {
    await ctx.pyro.deleteWorkspace(w.workspace_id).catch(() => {});
  }
}

export const SCENARIOS: Scenario[] = [
  {
    name: "exec: exit codes, stderr, env, cwd, output cap, and a timeout that kills the whole tree",
    run: (ctx) =>
      withWorkspace(ctx, async (id) => {
        const p = ctx.pyro;
        expect(await p.execWorkspace(id, "echo out; echo err >&2; exit 7")).toMatchObject({
          exit_code: 7,
          stdout: "out\n",
          stderr: "err\n",
          timed_out: false,
        });
        // A missing command is 127; a command killed by a signal is 128+N.
        const missing = await p.execWorkspace(id, "no-such-command-here");
        expect([missing.exit_code, missing.stderr.includes("not found")]).toEqual([127, true]);
        expect((await p.execWorkspace(id, "kill -TERM $$")).exit_code).toBe(143);
        expect(await code(p.execWorkspace(id, "pwd", { cwd: "/etc" }))).toBe("path_outside_workspace");
        expect(
          (await p.execWorkspace(id, 'echo "$GREETING"', { env: { GREETING: "hi there" } })).stdout,
        ).toBe("hi there\n");
        // The effect of cwd, not the path string: host-compat runs in a host directory.
        expect((await p.execWorkspace(id, "ls", { cwd: "/workspace/src" })).stdout).toBe("lib.txt\n");
        // Past 1 MiB a stream keeps its first and last 512 KiB around one marker line.
        const big = await p.execWorkspace(id, "head -c 1500000 /dev/zero | tr '\\0' a; echo end");
        expect([big.stdout_bytes, big.truncated]).toEqual([1500004, true]);
        expect(big.stdout).toBe(
          `${"a".repeat(512 * 1024)}\n[... ${1500004 - 1024 * 1024} bytes omitted ...]\n${"a".repeat(512 * 1024 - 4)}end\n`,
        );
        const started = Date.now();
        const slow = await p.execWorkspace(id, "sleep 600 & (setsid sleep 600 &) ; sleep 600", {
          timeoutSeconds: 2,
        });
        expect(slow.timed_out).toBe(true);
        expect(Date.now() - started).toBeLessThan(20_000);
        expect(
          (await p.execWorkspace(id, "ps -eo args 2>/dev/null | grep -c '^sleep 600' || true")).stdout.trim(),
        ).toBe("0");
      }),
  },
  {
    name: "files: write, read, list, binary round trip; every escape refused without changes",
    run: (ctx) =>
      withWorkspace(ctx, async (id) => {
        const p = ctx.pyro;
        await p.writeWorkspaceFile(id, "dir/note.txt", "hello\n");
        expect((await p.readWorkspaceFile(id, "/workspace/dir/note.txt")).content).toBe("hello\n");
        const bytes = Buffer.from([0, 255, 1, 254, 10, 13, 0x80]);
        await p.writeWorkspaceFile(id, "bin.dat", bytes);
        const back = await p.readWorkspaceFile(id, "bin.dat");
        expect(back.encoding).toBe("base64");
        expect(Buffer.from(back.content, "base64").equals(bytes)).toBe(true);
        // Plain coreutils metadata calls work (gVisor needs its statx shim for these).
        expect(
          (await p.execWorkspace(id, "ls -l dir/note.txt | cut -c1-10; stat -c %s dir/note.txt")).stdout,
        ).toBe("-rw-r--r--\n6\n");
        const list = await p.listWorkspaceFiles(id, "/workspace", { recursive: true });
        expect(list.entries.map((e) => e.path)).toEqual(
          expect.arrayContaining(["dir/note.txt", "bin.dat", "app.py"]),
        );
        await p.execWorkspace(id, "ln -s /etc escape-link");
        for (const bad of ["../outside.txt", "/etc/passwd", "escape-link/passwd"]) {
          expect(await code(p.writeWorkspaceFile(id, bad, "x"))).toBe("path_outside_workspace");
          expect(await code(p.readWorkspaceFile(id, bad))).toBe("path_outside_workspace");
        }
        expect((await p.diffWorkspace(id)).entries.map((e) => e.path).sort()).toEqual([
          "bin.dat",
          "dir/note.txt",
          "escape-link",
        ]);
      }),
  },
  {
    name: "patch, diff, export and reset: all-or-nothing patches, exact restores",
    run: (ctx) =>
      withWorkspace(ctx, async (id) => {
        const p = ctx.pyro;
        const good = [
          "--- a/app.py",
          "+++ b/app.py",
          "@@ -1 +1 @@",
          "-print('hello')",
          "+print('patched')",
          "",
        ].join("\n");
        expect(await p.applyWorkspacePatch(id, good)).toMatchObject({
          changed: true,
          files: [{ path: "app.py", status: "modified" }],
        });
        const bad = ["--- a/src/lib.txt", "+++ b/src/lib.txt", "@@ -1 +1 @@", "-nope", "+x", ""].join("\n");
        expect(await code(p.applyWorkspacePatch(id, bad))).toBe("patch_rejected");
        await p.execWorkspace(id, "rm src/lib.txt && echo new > added.txt");
        const d = await p.diffWorkspace(id);
        expect(d.summary).toEqual({ total: 3, added: 1, modified: 1, deleted: 1 });
        const out = await mkdtemp(join(tmpdir(), "pyro-parity-out-"));
        expect(await p.exportWorkspace(id, "app.py", join(out, "app.py"))).toMatchObject({
          artifact_type: "file",
        });
        expect(await readFile(join(out, "app.py"), "utf8")).toBe("print('patched')\n");
        await import("node:fs/promises").then((fs) => fs.rm(out, { recursive: true, force: true }));
        const r = await p.resetWorkspace(id);
        expect(r).toMatchObject({ reset_count: 1, workspace_reset: { snapshot_name: "baseline" } });
        expect((await p.diffWorkspace(id)).changed).toBe(false);
        expect((await p.readWorkspaceFile(id, "src/lib.txt")).content).toBe("one\ntwo\n");
      }),
  },
  {
    name: "sync push and export: a host directory in, a directory and a binary file out, byte for byte",
    run: (ctx) =>
      withWorkspace(ctx, async (id) => {
        const p = ctx.pyro;
        const host = await mkdtemp(join(tmpdir(), "pyro-parity-xfer-"));
        const { mkdir, rm } = await import("node:fs/promises");
        try {
          await mkdir(join(host, "push", "nested"), { recursive: true });
          await writeFile(join(host, "push", "a.txt"), "pushed\n");
          await writeFile(join(host, "push", "nested", "b.txt"), "deeper\n");
          await p.syncPushWorkspace(id, join(host, "push"), { dest: "incoming" });
          expect((await p.execWorkspace(id, "cat incoming/a.txt incoming/nested/b.txt")).stdout).toBe(
            "pushed\ndeeper\n",
          );
          await p.exportWorkspace(id, "incoming", join(host, "out"));
          expect(await readFile(join(host, "out", "nested", "b.txt"), "utf8")).toBe("deeper\n");
          const blob = Buffer.from(Array.from({ length: 200_000 }, (_, i) => (i * 7919) % 256));
          await p.writeWorkspaceFile(id, "blob.bin", blob);
          await p.exportWorkspace(id, "blob.bin", join(host, "blob.bin"));
          expect((await readFile(join(host, "blob.bin"))).equals(blob)).toBe(true);
        } finally {
          await rm(host, { recursive: true, force: true });
        }
      }),
  },
  {
    name: "snapshots: create, diff against, reset to, delete",
    run: (ctx) =>
      withWorkspace(ctx, async (id) => {
        const p = ctx.pyro;
        await p.execWorkspace(id, "echo cp > checkpoint.txt");
        await p.createSnapshot(id, "cp1");
        await p.execWorkspace(id, "echo later > later.txt && rm checkpoint.txt");
        expect((await p.diffWorkspace(id, { snapshot: "cp1" })).entries).toEqual([
          { path: "checkpoint.txt", status: "deleted" },
          { path: "later.txt", status: "added" },
        ]);
        await p.resetWorkspace(id, { snapshot: "cp1" });
        expect((await p.execWorkspace(id, "cat checkpoint.txt; test -e later.txt; echo $?")).stdout).toBe(
          "cp\n1\n",
        );
        await p.resetWorkspace(id);
        expect((await p.deleteSnapshot(id, "cp1")).deleted).toBe(true);
        expect((await p.listSnapshots(id)).snapshots.map((s) => s.snapshot_name)).toEqual(["baseline"]);
      }),
  },
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
  {
    name: "stop and start keep the files; a stopped workspace refuses work with workspace_stopped",
    run: (ctx) =>
      withWorkspace(ctx, async (id) => {
        const p = ctx.pyro;
        await p.writeWorkspaceFile(id, "kept.txt", "kept\n");
        // The root filesystem's writes are kept too, where there is a sandbox root to write
        // (not host-compat, whose root is the host's, nor the in-process fake).
        const sandboxed = ctx.target.real && ctx.target.backend !== "host";
        if (sandboxed) await p.execWorkspace(id, "echo root-layer > /root/kept");
        expect((await p.stopWorkspace(id)).state).toBe("stopped");
        expect(await code(p.execWorkspace(id, "true"))).toBe("workspace_stopped");
        expect((await p.startWorkspace(id)).state).toBe("running");
        expect((await p.execWorkspace(id, "cat kept.txt")).stdout).toBe("kept\n");
        if (sandboxed) expect((await p.execWorkspace(id, "cat /root/kept")).stdout).toBe("root-layer\n");
      }),
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
  const { mkdir } = await import("node:fs/promises");
  await mkdir(join(seed, "src"));
  await writeFile(join(seed, "src", "lib.txt"), "one\ntwo\n");
  return seed;
}
