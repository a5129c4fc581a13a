import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import {
  lstat,
  mkdir,
  mkdtemp,
  readdir,
  readFile,
  readlink,
  rm,
  stat,
  symlink,
  writeFile,
} from "node:fs/promises";
import { createConnection, createServer, type Server } from "node:net";
import { networkInterfaces, tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { BackendName } from "../../src/backends/backend.js";
import { Pyro } from "../../src/sdk/pyro.js";
import { REPO_ROOT } from "../helpers/cli.js";
import { ENV_CACHE } from "../helpers/sandbox.js";
import { parityTargets } from "../parity/backends.js";
import { runNetcheck } from "../parity/network.js";

/**
 * The escape suite: attacks from inside a workspace and through pyro's own tools, one
 * definition for every backend (one test file per backend, so they run in parallel). Each
 * test is one attempt and fails if the attempt got through. In-sandbox attempts run in
 * one python3 process (probe.py) and are judged from its report and from host state;
 * host-side attempts go through the SDK the way a model's tool calls would.
 *
 * Where an attempt is contained by the backend's own kernel rather than refused (gVisor's
 * user namespaces, raw sockets, mknod; anything inside a VM's guest kernel), it is
 * skipped with that reason: docs/backends.md gives the reasoning per backend.
 */

type Where = "sandbox" | "gvisor-contained" | "guest-contained";

/** Backends that bind the agent's package from the host (src/backends/agent-app.ts). */
const AGENT_APP_BACKENDS = new Set<BackendName>(["bwrap", "gvisor", "docker"]);

/** In-sandbox attempts (probe.py's names) and where each one is a boundary question. */
const PROBES: Record<string, Where> = {
  "sysctl kernel.core_pattern written": "guest-contained",
  "sysctl vm.swappiness written": "guest-contained",
  "any /proc/sys file opens for writing": "gvisor-contained",
  "/proc/sysrq-trigger opens for writing": "guest-contained",
  "a host-global /proc file opens for writing": "guest-contained",
  "a /sys file opens for writing": "gvisor-contained",
  "cgroup limits writable": "guest-contained",
  "kernel module loaded (finit_module reachable)": "guest-contained",
  "kexec_load reachable": "guest-contained",
  "host kernel keyring reachable (add_key)": "gvisor-contained",
  "host kernel keyring readable (keyctl)": "gvisor-contained",
  "kernel log readable (syslog)": "gvisor-contained",
  "/dev/kmsg opens for writing": "guest-contained",
  "host clock set (clock_settime)": "guest-contained",
  "bpf reachable": "guest-contained",
  "perf_event_open reachable": "gvisor-contained",
  "userfaultfd reachable": "gvisor-contained",
  "io_uring reachable": "gvisor-contained",
  "open_by_handle_at reachable (shocker)": "gvisor-contained",
  "mount a tmpfs": "guest-contained",
  "remount /proc/sys read-write": "guest-contained",
  "new user namespace": "gvisor-contained",
  "new mount namespace": "gvisor-contained",
  "join the host's namespaces (setns)": "guest-contained",
  chroot: "gvisor-contained",
  "mknod a memory device": "gvisor-contained",
  "host devices present": "guest-contained",
  "a host device node's mode or times changed": "gvisor-contained",
  "a host program's mode or times changed through /proc/PID/exe": "gvisor-contained",
  "AF_VSOCK socket created": "guest-contained",
  "raw packet socket created": "gvisor-contained",
  "a network interface besides lo": "sandbox",
  "host process visible": "sandbox",
  "host process signalled": "sandbox",
  "host environment readable": "sandbox",
  "host file readable": "sandbox",
  "host file written": "sandbox",
  "host's pyro state visible": "sandbox",
  "another workspace's files visible": "sandbox",
  "another workspace's agent socket reachable": "sandbox",
  "another workspace's secret readable": "sandbox",
  "host service on loopback reachable": "sandbox",
  "host service on the host's own addresses reachable": "sandbox",
  "host log grown through inherited descriptors": "sandbox",
};

const GVISOR_WHY = "contained by gVisor's own kernel, which reaches no host state (docs/backends.md)";
const GUEST_WHY = "contained by the VM's own guest kernel (docs/backends.md)";

/** Why an in-sandbox attempt is not a boundary question on `backend`, or "". */
function probeSkip(backend: BackendName, where: Where): string {
  if (backend === "host") return "host-compat has no sandbox: commands run as the user on purpose";
  if (where === "gvisor-contained" && backend === "gvisor") return GVISOR_WHY;
  if (
    (where === "gvisor-contained" || where === "guest-contained") &&
    (backend === "qemu" || backend === "firecracker")
  )
    return GUEST_WHY;
  return "";
}

type Report = Record<string, { escaped: boolean; detail: string }>;

interface Ctx {
  pyro: Pyro;
  home: string;
  a: string;
  b: string;
  aSocket: string | null;
  scratch: string;
  canary: string;
  canaryContent: string;
  writeTarget: string;
  marker: ChildProcess;
  markerText: string;
  listener: Server;
  connections: number;
  port: number;
  envValue: string;
  otherSecret: string;
  otherMarker: string;
  sysctlsBefore: Record<string, string>;
  report: Report;
}

const SYSCTLS = ["/proc/sys/kernel/core_pattern", "/proc/sys/vm/swappiness", "/proc/sys/kernel/pid_max"];

function hostIps(): string[] {
  return Object.values(networkInterfaces())
    .flat()
    .filter((i) => i && i.family === "IPv4" && !i.internal)
    .map((i) => i!.address);
}

async function sandboxState(home: string, id: string): Promise<Record<string, unknown> | null> {
  const { default: Database } = await import("better-sqlite3");
  const db = new Database(join(home, "state.db"), { readonly: true });
  try {
    const row = db.prepare("SELECT runtime FROM workspaces WHERE workspace_id = ?").get(id) as
      | { runtime: string }
      | undefined;
    const sandbox = row ? (JSON.parse(row.runtime) as { sandbox?: unknown }).sandbox : null;
    return sandbox && typeof sandbox === "object" ? (sandbox as Record<string, unknown>) : null;
  } finally {
    db.close();
  }
}

/** A command's stdout; throws with its stderr when it fails. */
function spawnSyncText(cmd: string, args: string[], env: Record<string, string> = {}): string {
  const r = spawnSync(cmd, args, { encoding: "utf8", env: { ...process.env, ...env } });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(" ")} failed: ${r.stderr}`);
  return r.stdout;
}

async function expectRefused(
  p: Promise<unknown>,
  codes: string[] = ["path_outside_workspace"],
): Promise<void> {
  const got = await p.then(
    () => "succeeded",
    (e: { code?: string }) => e.code ?? String(e),
  );
  expect(codes, `expected a refusal, got ${got}`).toContain(got);
}

/** Defines the escape suite for one backend. */
export function escapeSuite(backend: BackendName): void {
  const target = parityTargets().find((t) => t.label === backend);
  const skip = target?.skip ?? `no parity target for ${backend}`;
  describe.skipIf(skip !== "")(`escape attempts on ${backend}${skip ? ` (skipped: ${skip})` : ""}`, () => {
    const ctx = {} as Ctx;
    const create = { backend, ...(backend === "host" ? { allowHostCompat: true } : {}) };
    const sandboxed = backend !== "host";

    beforeAll(async () => {
      ctx.scratch = await mkdtemp(join(tmpdir(), `pyro-escape-${backend}-`));
      const tag = randomBytes(6).toString("hex");
      // Host state the attempts aim at.
      ctx.canary = join(ctx.scratch, "host-canary", "secret.txt");
      ctx.canaryContent = `host-canary-${tag}`;
      await mkdir(join(ctx.scratch, "host-canary"));
      await writeFile(ctx.canary, ctx.canaryContent);
      ctx.writeTarget = join(ctx.scratch, `pwned-${tag}`);
      ctx.markerText = `pyro-escape-marker-${tag}`;
      ctx.marker = spawn("sleep", ["600"], { argv0: ctx.markerText, stdio: "ignore" });
      ctx.connections = 0;
      ctx.listener = createServer((s) => {
        ctx.connections++;
        s.destroy();
      });
      await new Promise<void>((r) => ctx.listener.listen(0, "0.0.0.0", () => r()));
      ctx.port = (ctx.listener.address() as { port: number }).port;
      ctx.envValue = `host-only-canary-${tag}`;
      process.env.HOST_ONLY_CANARY = ctx.envValue;
      ctx.sysctlsBefore = Object.fromEntries(SYSCTLS.map((p) => [p, readFileSync(p, "utf8")]));

      const opened = await target!.open();
      ctx.pyro = opened.pyro;
      ctx.home = opened.home;
      ctx.otherSecret = `other-secret-${tag}`;
      ctx.otherMarker = `other-marker-${tag}`;
      const b = await ctx.pyro.createWorkspace({
        ...create,
        name: "victim",
        secrets: { TOKEN: ctx.otherSecret },
      });
      ctx.b = b.workspace_id;
      await ctx.pyro.writeWorkspaceFile(ctx.b, ctx.otherMarker, "victim's file");
      const a = await ctx.pyro.createWorkspace({ ...create, name: "attacker" });
      ctx.a = a.workspace_id;
      const stateB = await sandboxState(ctx.home, ctx.b);
      const stateA = await sandboxState(ctx.home, ctx.a);
      ctx.aSocket = typeof stateA?.socket === "string" ? stateA.socket : null;

      if (!sandboxed) return;
      const probe = readFileSync(join(REPO_ROOT, "tests", "escape", "probe.py"));
      const args = {
        // Reversed, so the probe's own command line does not contain it.
        host_marker_reversed: [...ctx.markerText].reverse().join(""),
        host_marker_pid: ctx.marker.pid,
        host_env_values: [ctx.envValue, ctx.home, ENV_CACHE],
        host_canary: ctx.canary,
        host_canary_content: ctx.canaryContent,
        host_write_target: ctx.writeTarget,
        host_paths: [join(ctx.home, "state.db"), ctx.home, ctx.scratch],
        other_marker: ctx.otherMarker,
        other_socket: typeof stateB?.socket === "string" ? stateB.socket : join(ctx.home, "nonexistent.sock"),
        other_secret: ctx.otherSecret,
        host_port: ctx.port,
        host_ips: hostIps(),
      };
      await ctx.pyro.execWorkspace(ctx.a, `echo ${probe.toString("base64")} | base64 -d > /tmp/probe.py`);
      const r = await ctx.pyro.execWorkspace(ctx.a, `python3 /tmp/probe.py '${JSON.stringify(args)}'`, {
        timeoutSeconds: 240,
      });
      try {
        ctx.report = JSON.parse(r.stdout) as Report;
      } catch {
        throw new Error(`probe.py did not report (exit ${r.exit_code}): ${r.stderr.slice(-2000)}`);
      }
    }, 600_000);

    afterAll(async () => {
      ctx.marker?.kill("SIGKILL");
      ctx.listener?.close();
      delete process.env.HOST_ONLY_CANARY;
      if (ctx.pyro) {
        for (const w of (await ctx.pyro.listWorkspaces()).workspaces)
          await ctx.pyro.deleteWorkspace(w.workspace_id).catch(() => {});
        await ctx.pyro.close();
      }
      if (ctx.home) await rm(ctx.home, { recursive: true, force: true });
      if (ctx.scratch) await rm(ctx.scratch, { recursive: true, force: true });
    });

    // --- in-sandbox attempts -------------------------------------------------------------
    for (const [name, where] of Object.entries(PROBES)) {
      const why = probeSkip(backend, where);
      it.skipIf(why !== "")(`${backend}: ${name}${why ? ` (skipped: ${why})` : ""}`, () => {
        const r = ctx.report[name];
        expect(r, `probe.py did not report '${name}'`).toBeDefined();
        expect(r!.escaped, `${backend}: ${name}: ${r!.detail}`).toBe(false);
      });
    }

    // --- host state after the in-sandbox attempts ---------------------------------------
    it.skipIf(!sandboxed)(
      `${backend}: host sysctls unchanged, marker process alive, no connection, nothing written`,
      () => {
        for (const p of SYSCTLS) expect(readFileSync(p, "utf8"), p).toBe(ctx.sysctlsBefore[p]);
        expect(ctx.marker.exitCode).toBeNull();
        expect(ctx.marker.signalCode).toBeNull();
        expect(ctx.connections).toBe(0);
        expect(existsSync(ctx.writeTarget)).toBe(false);
        expect(readFileSync(ctx.canary, "utf8")).toBe(ctx.canaryContent);
      },
    );

    it.skipIf(!AGENT_APP_BACKENDS.has(backend))(
      `${backend}: the agent's package in the sandbox holds only what the agent runs (no sources, .git or host modules)`,
      async () => {
        const r = await ctx.pyro.execWorkspace(ctx.a, "cd /run/pyro/app && find . -maxdepth 3 | sort");
        expect(r.exit_code, r.stderr).toBe(0);
        // The command starter where the host has a C compiler (spawn-helper.ts), and nothing else.
        const found = r.stdout.trim().split("\n");
        expect(found.filter((f) => f.startsWith("./bin"))).toEqual(
          found.includes("./bin") ? ["./bin", "./bin/pyro-spawn"] : [],
        );
        expect(found.filter((f) => !f.startsWith("./bin"))).toEqual([
          ".",
          "./dist",
          "./dist/agent",
          "./dist/agent/bundle",
          "./node_modules",
          "./node_modules/node-pty",
          "./node_modules/node-pty/build",
          "./node_modules/node-pty/lib",
          "./node_modules/node-pty/package.json",
          "./package.json",
        ]);
      },
    );

    it.skipIf(backend !== "bwrap" && backend !== "gvisor")(
      `${backend}: the sandbox cannot grow its host log past the cap`,
      async () => {
        const logs = join(ctx.home, "workspaces", ctx.a, "sandbox", "logs");
        for (const f of await readdir(logs))
          expect((await stat(join(logs, f))).size, f).toBeLessThanOrEqual(64 * 1024);
      },
    );

    it.skipIf(backend !== "bwrap")(`${backend}: cgroup limits unchanged on the host`, async () => {
      const limit = await readFile(`/sys/fs/cgroup/memory/pyro/${ctx.a}/memory.limit_in_bytes`, "utf8").catch(
        () => "",
      );
      if (limit === "") return expect(existsSync("/sys/fs/cgroup/memory/pyro")).toBe(false);
      expect(Number(limit)).toBe(1024 * 1024 * 1024);
    });

    it.skipIf(backend !== "bwrap")(
      `${backend}: a recipe build's steps cannot reach host files through the environment it saves`,
      async () => {
        const name = `escape-recipe-${randomBytes(4).toString("hex")}`;
        const built = await ctx.pyro.buildEnvironment({
          name,
          from: "debian:12",
          run: [
            // Links to host paths, and writes through them, all inside the sandbox.
            `ln -s / /etc/host-root && ln -s ${ctx.scratch} /etc/host-scratch`,
            `mkdir -p ${ctx.scratch} && echo pwned > /etc/host-scratch/${ctx.markerText} || true`,
            `ln -s ${ctx.canary} /etc/canary-link && echo overwritten > /etc/canary-link || true`,
          ],
        });
        try {
          // Saved as links, never followed by the host while saving.
          expect((await lstat(join(built.rootfs, "etc/host-root"))).isSymbolicLink()).toBe(true);
          expect(await readlink(join(built.rootfs, "etc/host-scratch"))).toBe(ctx.scratch);
          expect(existsSync(join(ctx.scratch, ctx.markerText))).toBe(false);
          expect(readFileSync(ctx.canary, "utf8")).toBe(ctx.canaryContent);
        } finally {
          await rm(built.path, { recursive: true, force: true });
        }
      },
      300_000,
    );

    // --- through pyro's file tools --------------------------------------------------------
    it(`${backend}: file tools refuse '..' out of /workspace, for reads and writes`, async () => {
      await expectRefused(ctx.pyro.readWorkspaceFile(ctx.a, "../../../../../../etc/hostname"));
      await expectRefused(ctx.pyro.writeWorkspaceFile(ctx.a, `../../../../../..${ctx.writeTarget}`, "x"));
      expect(existsSync(ctx.writeTarget)).toBe(false);
    });

    it(`${backend}: file tools refuse absolute host paths`, async () => {
      await expectRefused(ctx.pyro.readWorkspaceFile(ctx.a, ctx.canary));
      await expectRefused(ctx.pyro.writeWorkspaceFile(ctx.a, ctx.writeTarget, "x"));
      expect(existsSync(ctx.writeTarget)).toBe(false);
    });

    it(`${backend}: file tools do not follow a symlink out of /workspace`, async () => {
      await ctx.pyro.execWorkspace(ctx.a, `ln -sfn ${ctx.canary} to-canary`);
      const got = await ctx.pyro.readWorkspaceFile(ctx.a, "to-canary").then(
        (r) => (r as { content: string }).content,
        (e: { code?: string }) => e.code,
      );
      expect(got).not.toContain(ctx.canaryContent);
    });

    it(`${backend}: disk tools of a stopped workspace do not follow symlinks out to host files`, async () => {
      await ctx.pyro.execWorkspace(
        ctx.a,
        `ln -sfn ${ctx.canary} disk-canary && mkdir -p disk-tree && ln -sfn ${ctx.canary} disk-tree/link && ln -sfn / disk-root`,
      );
      await ctx.pyro.stopWorkspace(ctx.a);
      try {
        for (const p of ["disk-canary", "disk-root/etc/hostname", `disk-root${ctx.canary}`]) {
          const got = await ctx.pyro.readWorkspaceDisk(ctx.a, p).then(
            (r) => r.content,
            (e: { code?: string }) => e.code,
          );
          expect([p, got]).toEqual([p, "path_outside_workspace"]);
        }
        const out = join(ctx.scratch, `disk-out-${randomBytes(3).toString("hex")}`);
        await ctx.pyro.exportWorkspaceDisk(ctx.a, "disk-tree", out).catch(() => {});
        if (existsSync(out))
          for (const n of await readdir(out)) expect((await lstat(join(out, n))).isFile(), n).toBe(false);
        expect((await ctx.pyro.getWorkspace(ctx.a)).state).toBe("stopped");
      } finally {
        await ctx.pyro.startWorkspace(ctx.a);
      }
    });

    it(`${backend}: file tools do not write through a symlinked parent`, async () => {
      await ctx.pyro.execWorkspace(ctx.a, `ln -sfn ${ctx.scratch} to-scratch`);
      await ctx.pyro
        .writeWorkspaceFile(ctx.a, `to-scratch/pwned-${randomBytes(3).toString("hex")}`, "x")
        .catch(() => {});
      expect((await readdir(ctx.scratch)).filter((n) => n.startsWith("pwned"))).toEqual([]);
    });

    it(`${backend}: a pushed host symlink stays a symlink and is not followed into the host`, async () => {
      const src = join(ctx.scratch, "push-src");
      await mkdir(src, { recursive: true });
      await symlink(join(ctx.scratch, "host-canary"), join(src, "evil"));
      await writeFile(join(src, "plain.txt"), "plain");
      // Refusing the push (a symlink leading out) is as good as keeping it a symlink.
      const pushed = await ctx.pyro.syncPushWorkspace(ctx.a, src, { dest: "/workspace/pushed" }).then(
        () => true,
        (e: { code?: string }) => expect(e.code).toBe("path_outside_workspace"),
      );
      const r = await ctx.pyro.execWorkspace(ctx.a, "cat pushed/evil/secret.txt 2>&1; true");
      if (sandboxed && pushed === true) expect(r.stdout).not.toContain(ctx.canaryContent);
      // Host-compat reads host files by design; what matters is that nothing was written there.
      expect(await readdir(join(ctx.scratch, "host-canary"))).toEqual(["secret.txt"]);
    });

    // --- what exports write on the host ---------------------------------------------------
    it(`${backend}: an exported setuid-root file lands without setuid, owned by the invoking user`, async () => {
      await ctx.pyro.execWorkspace(ctx.a, "cp /bin/true suid && chmod 4755 suid");
      const out = join(ctx.scratch, "suid-out");
      await ctx.pyro.exportWorkspace(ctx.a, "suid", out);
      const st = await stat(out);
      expect(st.mode & 0o7000).toBe(0);
      expect(st.uid).toBe(process.getuid?.() ?? 0);
    });

    it(`${backend}: an export never creates setuid files, FIFOs, devices or hard links on the host`, async () => {
      await ctx.pyro.execWorkspace(
        ctx.a,
        "mkdir -p tree && cd tree && printf a > a && ln a b 2>/dev/null; " +
          "cp /bin/true s && chmod 6755 s; mkfifo f 2>/dev/null; true",
      );
      const out = join(ctx.scratch, "tree-out");
      await ctx.pyro.exportWorkspace(ctx.a, "tree", out).catch(() => {});
      if (!existsSync(out)) return; // refused whole: nothing written, which is fine
      for (const n of await readdir(out)) {
        const st = await lstat(join(out, n));
        expect(st.isFile() || st.isDirectory() || st.isSymbolicLink(), n).toBe(true);
        expect(st.mode & 0o7000, n).toBe(0);
        if (st.isFile()) expect(st.nlink, n).toBe(1);
      }
    });

    it(`${backend}: an export holding a symlink out of the tree is refused and writes nothing`, async () => {
      await ctx.pyro.execWorkspace(ctx.a, "mkdir -p lnk && ln -sfn /etc/shadow lnk/shadow");
      const out = join(ctx.scratch, "lnk-out");
      await expectRefused(ctx.pyro.exportWorkspace(ctx.a, "lnk", out));
      expect(existsSync(out)).toBe(false);
      expect((await readdir(ctx.scratch)).filter((n) => n.startsWith(".pyro-export-"))).toEqual([]);
    });

    it(`${backend}: an export does not write through a symlink at the output path`, async () => {
      const victim = join(ctx.scratch, "victim.txt");
      await writeFile(victim, "untouched");
      const out = join(ctx.scratch, "out-link");
      await symlink(victim, out);
      await ctx.pyro.execWorkspace(ctx.a, "printf new > new.txt");
      await ctx.pyro.exportWorkspace(ctx.a, "new.txt", out).catch(() => {});
      expect(await readFile(victim, "utf8")).toBe("untouched");
    });

    it(`${backend}: workspace state on the host is private to its owner (0700)`, async () => {
      const st = await stat(join(ctx.home, "workspaces", ctx.a));
      expect(st.mode & 0o077).toBe(0);
    });

    // --- workspace commit: the sandbox's .git and files never drive host Git ----------------
    it(`${backend}: a commit runs no hook, fsmonitor or filter and follows no symlink, whatever the workspace plants`, async () => {
      const repo = join(ctx.scratch, "commit-repo");
      const marker = (n: string) => join(ctx.scratch, `git-pwned-${n}`);
      const g = (...a: string[]) =>
        spawnSyncText("git", ["-C", repo, ...a], {
          GIT_AUTHOR_NAME: "t",
          GIT_AUTHOR_EMAIL: "t@t",
          GIT_COMMITTER_NAME: "t",
          GIT_COMMITTER_EMAIL: "t@t",
        });
      spawnSyncText("git", ["init", "-q", "-b", "main", repo]);
      await writeFile(join(repo, "a.txt"), "a\n");
      g("add", ".");
      g("commit", "-qm", "seed");
      // The user's own hooks and a clean filter: a commit by pyro must not run them either.
      for (const hook of ["reference-transaction", "post-commit", "pre-commit", "post-checkout"]) {
        await writeFile(join(repo, ".git", "hooks", hook), `#!/bin/sh\ntouch ${marker(`host-${hook}`)}\n`, {
          mode: 0o755,
        });
      }
      g("config", "filter.evil.clean", `touch ${marker("filter")}; cat`);
      const configBefore = await readFile(join(repo, ".git", "config"));
      const w = await ctx.pyro.createWorkspace({ ...create, seedPath: repo });
      try {
        const planted = [
          // The workspace's own repository: hooks, fsmonitor, hooksPath, includes, alternates.
          ...["post-commit", "pre-commit", "reference-transaction", "fsmonitor-watchman"].map(
            (h) =>
              `printf '#!/bin/sh\\ntouch ${marker(`ws-${h}`)}\\n' > .git/hooks/${h} && chmod +x .git/hooks/${h}`,
          ),
          `git config core.fsmonitor 'touch ${marker("fsmonitor")}'`,
          `git config core.hooksPath /workspace/.git/hooks`,
          `git config include.path ${join(ctx.scratch, "nope")}`,
          `mkdir -p .git/objects/info && echo ${join(repo, ".git", "objects")} > .git/objects/info/alternates`,
          // Files: a filter request, symlinks out, a submodule trick, a nested repository.
          "printf '* filter=evil\\n' > .gitattributes",
          `ln -s ${ctx.canary} canary-link`,
          "ln -s / root-link",
          "mkdir -p x/.git && printf '[core]\\n\\tfsmonitor = touch /tmp/x\\n' > x/.git/config && echo inner > x/file",
        ].join(" && ");
        await ctx.pyro.writeWorkspaceFile(
          w.workspace_id,
          ".gitmodules",
          `[submodule "x"]\n\tpath = x\n\turl = ext::sh -c touch% ${marker("submodule")}\n`,
        );
        const r = await ctx.pyro.execWorkspace(w.workspace_id, planted);
        expect(r.exit_code, r.stderr).toBe(0);
        const c = await ctx.pyro.commitWorkspace(w.workspace_id, { branch: "pyro/escape" });
        expect(c.files.map((f) => f.path)).not.toContain("x/.git/config");
        // Nothing ran on the host.
        expect((await readdir(ctx.scratch)).filter((n) => n.startsWith("git-pwned-"))).toEqual([]);
        // Symlinks are committed as links (their target text), never followed.
        expect(g("cat-file", "-p", "pyro/escape:canary-link")).toBe(ctx.canary);
        expect(
          g("ls-tree", "pyro/escape", "canary-link", "root-link")
            .split("\n")
            .filter(Boolean)
            .map((l) => l.split(" ")[0]),
        ).toEqual(["120000", "120000"]);
        expect(g("ls-tree", "-r", "--name-only", "pyro/escape")).not.toContain(".git/");
        // The host repository's config, HEAD and hooks are as they were; no alternates appeared.
        expect(await readFile(join(repo, ".git", "config"))).toEqual(configBefore);
        expect(g("symbolic-ref", "HEAD").trim()).toBe("refs/heads/main");
        expect(existsSync(join(repo, ".git", "objects", "info", "alternates"))).toBe(false);
        // A later git command on the host does not run anything the workspace planted either.
        g("log", "--oneline", "pyro/escape");
        expect((await readdir(ctx.scratch)).filter((n) => n.startsWith("git-pwned-"))).toEqual([]);
      } finally {
        await ctx.pyro.deleteWorkspace(w.workspace_id).catch(() => {});
      }
    });

    // --- shells ---------------------------------------------------------------------------
    it.skipIf(!sandboxed)(
      `${backend}: a shell runs in the sandbox: what it types writes no host file and reaches no host terminal`,
      async () => {
        const { createRequire } = await import("node:module");
        const pty = createRequire(import.meta.url)("node-pty") as typeof import("node-pty");
        // A terminal on the host, as a user's own would be, recording what reaches it.
        const hostTerm = pty.spawn("/bin/cat", [], { cols: 80, rows: 24, env: { PATH: "/usr/bin:/bin" } });
        let seen = "";
        hostTerm.onData((d) => {
          seen += d;
        });
        const canary = `pty-canary-${randomBytes(4).toString("hex")}`;
        try {
          const sh = await ctx.pyro.openShell(ctx.a);
          const attack = [
            `touch ${ctx.writeTarget}`,
            // Inject and write the canary into every terminal the sandbox can open.
            `python3 -c "import fcntl,glob,os
for p in glob.glob('/dev/pts/*')+glob.glob('/dev/tty*')+['/dev/console']:
  try:
    fd=os.open(p,os.O_RDWR|os.O_NOCTTY)
  except OSError: continue
  try: os.write(fd,b'${canary}\\n')
  except OSError: pass
  for c in b'${canary}\\n':
    try: fcntl.ioctl(fd,0x5412,bytes([c]))
    except OSError: pass
  os.close(fd)"`,
            "echo shell-attack-done",
          ];
          for (const line of attack) await ctx.pyro.writeShell(ctx.a, sh.shell_id, line);
          let out = "";
          for (let i = 0; i < 40 && !out.includes("shell-attack-done\n"); i++)
            out += (
              await ctx.pyro.readShell(ctx.a, sh.shell_id, { plain: false, waitForIdleMs: 250 })
            ).output.replace(/\r/g, "");
          expect(out).toContain("shell-attack-done");
          await ctx.pyro.closeShell(ctx.a, sh.shell_id);
          expect(existsSync(ctx.writeTarget)).toBe(false);
          expect(seen).not.toContain(canary);
        } finally {
          hostTerm.kill();
        }
      },
    );

    // --- the agent channel ----------------------------------------------------------------
    it.skipIf(backend !== "bwrap" && backend !== "gvisor" && backend !== "docker" && backend !== "host")(
      `${backend}: a socket the sandbox swaps for a symlink is refused and the host socket it names gets nothing`,
      async () => {
        const bait = join(ctx.scratch, "bait.sock");
        let baited = 0;
        const baitServer = createServer((s) => {
          baited++;
          s.destroy();
        });
        await new Promise<void>((r) => baitServer.listen(bait, () => r()));
        try {
          const sockDir = ctx.aSocket ? join(ctx.aSocket, "..") : "";
          const inside = backend === "host" ? sockDir : "/run/pyro/sock";
          await ctx.pyro.execWorkspace(
            ctx.a,
            `rm -f ${inside}/agent.sock && ln -s ${bait} ${inside}/agent.sock`,
          );
          // A fresh client, as the next CLI call would be (the open one has a warm connection).
          const next = new Pyro({ home: ctx.home, environmentsDir: ENV_CACHE, env: { ...process.env } });
          try {
            await expectRefused(next.execWorkspace(ctx.a, "true"), ["backend_unavailable"]);
          } finally {
            await next.close();
          }
          expect(baited).toBe(0);
          expect((await lstat(ctx.aSocket!)).isSymbolicLink()).toBe(true);
          expect(await readlink(ctx.aSocket!)).toBe(bait);
        } finally {
          baitServer.close();
        }
      },
    );

    // --- the network (docs/network.md) ----------------------------------------------------
    const bindsNet = backend === "bwrap" || backend === "gvisor" || backend === "docker";
    const networked = bindsNet || backend === "qemu" || backend === "firecracker" || backend === "host";

    it.skipIf(!networked)(
      `${backend}: the egress proxy refuses the host's loopback and own addresses, by name and literal, and dials nothing`,
      async () => {
        const w = await ctx.pyro.createWorkspace({ ...create, networkPolicy: "egress" });
        try {
          const before = ctx.connections;
          const targets = [
            `127.0.0.1:${ctx.port}`,
            `localhost:${ctx.port}`,
            ...hostIps().map((ip) => `${ip}:${ctx.port}`),
          ];
          const results = await runNetcheck(
            ctx.pyro,
            w.workspace_id,
            backend,
            targets.map((t) => `http=${t}`),
          );
          for (const [i, r] of results.entries()) expect(r.status, targets[i]).toBe(403);
          expect(ctx.connections).toBe(before);
          const blocks = (await ctx.pyro.networkBlocks(w.workspace_id)).blocks.map((b) => b.target);
          expect(blocks).toEqual(expect.arrayContaining(targets));
        } finally {
          await ctx.pyro.deleteWorkspace(w.workspace_id);
        }
      },
    );

    it.skipIf(!bindsNet)(
      `${backend}: the proxy's directory is read-only inside: its socket cannot be removed, replaced or joined`,
      async () => {
        const w = await ctx.pyro.createWorkspace({ ...create, networkPolicy: "egress" });
        try {
          const r = await ctx.pyro.execWorkspace(
            w.workspace_id,
            "rm -f /run/pyro/net/proxy.sock; ln -s /tmp/x /run/pyro/net/evil; touch /run/pyro/net/evil2; ls -A /run/pyro/net",
          );
          expect(r.stdout.trim()).toBe("proxy.sock");
          const host = join(ctx.home, "workspaces", w.workspace_id, "net", "sandbox", "proxy.sock");
          expect((await lstat(host)).isSocket()).toBe(true);
        } finally {
          await ctx.pyro.deleteWorkspace(w.workspace_id);
        }
      },
    );

    it.skipIf(!bindsNet)(
      `${backend}: a published port whose forward socket the sandbox swaps for a symlink reaches nothing on the host`,
      async () => {
        const bait = join(ctx.scratch, "bait-forward.sock");
        let baited = 0;
        const baitServer = createServer((s) => {
          baited++;
          s.destroy();
        });
        await new Promise<void>((r) => baitServer.listen(bait, () => r()));
        const w = await ctx.pyro.createWorkspace({
          ...create,
          publishedPorts: [{ host_port: 0, guest_port: 9 }],
        });
        try {
          await ctx.pyro.execWorkspace(
            w.workspace_id,
            `rm -f /run/pyro/sock/forward.sock && ln -s ${bait} /run/pyro/sock/forward.sock`,
          );
          const port = w.published_ports[0]!.host_port;
          await new Promise<void>((resolve) => {
            const c = createConnection({ host: "127.0.0.1", port });
            c.on("error", () => resolve());
            c.on("close", () => resolve());
            c.write("hello\n");
          });
          expect(baited).toBe(0);
        } finally {
          baitServer.close();
          await ctx.pyro.deleteWorkspace(w.workspace_id);
        }
      },
    );
  });
}
