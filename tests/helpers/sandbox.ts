import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { delimiter, dirname, join } from "node:path";
import { resolvePaths } from "../../src/core/config.js";
import { PyroError } from "../../src/errors.js";
import type { CreateWorkspaceOptions, WorkspaceView } from "../../src/sdk/index.js";
import { Pyro } from "../../src/sdk/pyro.js";
import { isRoot, PYRO_BIN, REPO_ROOT } from "./cli.js";

/**
 * Fixtures for the real-sandbox integration tests (tests/integration/bwrap, .../host):
 * why a suite cannot run here, a private pyro home per test file that deletes every
 * workspace it made, and host-side probes (processes, mounts) to check what a sandbox
 * left behind. Suites run the built agent (dist/), so `npm run build` comes first.
 */

/**
 * The environment cache the tests share: PYRO_ENV_CACHE (CI keeps one outside the clone),
 * else the default one, where `scripts/setup` builds debian:12. Resolved like the product
 * does (src/core/config.ts), so a plain `npm test` after setup finds what setup built.
 */
export const ENV_CACHE = resolvePaths({ env: process.env }).environmentsDir;

/** Why the shared cache cannot serve debian:12 without a from-scratch build, or "". */
export function envCacheSkipReason(): string {
  const built = (() => {
    try {
      return readdirSync(ENV_CACHE).some((e) => e.startsWith("debian_12@") || e.startsWith("debian:12@"));
    } catch {
      return false;
    }
  })();
  return built
    ? ""
    : `debian:12 is not built in ${ENV_CACHE} (scripts/setup builds it; PYRO_ENV_CACHE moves it)`;
}

export function onPath(bin: string): boolean {
  return (process.env.PATH ?? "").split(delimiter).some((d) => d !== "" && existsSync(join(d, bin)));
}

const AGENT_ENTRY = join(REPO_ROOT, "dist", "agent", "bundle", "main.js");

/** Why the bwrap suites cannot run on this host, or "" when they can. */
export function bwrapSkipReason(): string {
  if (!isRoot) return "needs root: the bwrap backend mounts overlays and creates cgroups";
  if (!onPath("bwrap")) return "bubblewrap (bwrap) is not installed";
  return envCacheSkipReason();
}

/**
 * Why the qemu suites cannot run on this host, or "" when they can. They need no KVM:
 * TCG is slow but real (every test VM is restored from one template per run).
 */
export function qemuSkipReason(): string {
  for (const bin of ["qemu-system-x86_64", "qemu-img", "mkfs.ext4", "busybox"])
    if (!onPath(bin)) return `${bin} is not installed (npm run setup)`;
  return envCacheSkipReason();
}

/** Why the gVisor suites cannot run on this host, or "" when they can. */
export function gvisorSkipReason(): string {
  if (!isRoot) return "needs root: the gvisor backend mounts overlays, creates cgroups and runs runsc";
  if (!onPath("runsc")) return "runsc (gVisor) is not installed";
  return envCacheSkipReason();
}

/** Why the host-compat suite cannot run here, or "" when it can. */
export function hostSkipReason(): string {
  return envCacheSkipReason();
}

/** A describe title that says why it was skipped. */
export function suiteTitle(title: string, skipReason: string): string {
  return skipReason ? `${title} (skipped: ${skipReason})` : title;
}

/** One test file's pyro: its own home, the shared environment cache, CLI env to match. */
export interface Harness {
  home: string;
  pyro: Pyro;
  /** Environment for CLI children so they see the same home and cache. */
  cliEnv: NodeJS.ProcessEnv;
  /** Creates a workspace (bwrap unless told otherwise). */
  create(options?: CreateWorkspaceOptions): Promise<WorkspaceView>;
  /** A fresh temp directory removed with the harness. */
  tempDir(tag: string): Promise<string>;
  /** Deletes every workspace of the home (whoever made it), closes the SDK, removes temp dirs. */
  cleanup(): Promise<void>;
}

export async function openHarness(
  tag: string,
  defaults: CreateWorkspaceOptions = { backend: "bwrap" },
  options: {
    /** Extra environment for the SDK's engine and for CLI children (e.g. DOCKER_HOST). */
    env?: NodeJS.ProcessEnv;
  } = {},
): Promise<Harness> {
  // A missing build is a setup error, not a reason to skip: fail loudly.
  if (!existsSync(AGENT_ENTRY))
    throw new Error(`${AGENT_ENTRY} is missing: run \`npm run build\` before the integration tests`);
  const home = await mkdtemp(join(tmpdir(), `pyro-it-${tag}-`));
  const pyro = new Pyro({
    home,
    environmentsDir: ENV_CACHE,
    ...(options.env ? { env: { ...process.env, ...options.env } } : {}),
  });
  const temps: string[] = [];
  return {
    home,
    pyro,
    cliEnv: { PYRO_HOME: home, PYRO_ENV_CACHE: ENV_CACHE, ...options.env },
    create: (options = {}) => pyro.createWorkspace({ ...defaults, ...options }),
    tempDir: async (t) => {
      const d = await mkdtemp(join(tmpdir(), `pyro-it-${t}-`));
      temps.push(d);
      return d;
    },
    cleanup: async () => {
      const failures: string[] = [];
      try {
        for (const w of (await pyro.listWorkspaces()).workspaces) {
          await pyro
            .deleteWorkspace(w.workspace_id)
            .catch((err: Error) => failures.push(`${w.workspace_id}: ${err.message}`));
        }
      } finally {
        await pyro.close();
      }
      const mounts = mountsMentioning(home);
      if (mounts.length === 0) await rm(home, { recursive: true, force: true });
      for (const d of temps) await rm(d, { recursive: true, force: true });
      if (failures.length > 0 || mounts.length > 0) {
        throw new Error(
          `cleanup of ${home} failed: ${[...failures, ...mounts.map((m) => `mount left: ${m}`)].join("; ")}`,
        );
      }
    },
  };
}

/** The PyroError a promise rejects with; fails the test if it resolves. */
export async function errorOf(p: Promise<unknown>): Promise<PyroError> {
  try {
    await p;
  } catch (err) {
    if (err instanceof PyroError) return err;
    throw new Error(`expected a PyroError, got: ${String(err)}`);
  }
  throw new Error("expected the call to fail, but it succeeded");
}

/** Writes `files` (relative path → text) under `dir`, creating parents. */
export async function writeTree(dir: string, files: Record<string, string>): Promise<void> {
  for (const [rel, text] of Object.entries(files)) {
    await mkdir(dirname(join(dir, rel)), { recursive: true });
    await writeFile(join(dir, rel), text);
  }
}

export interface HostProcess {
  pid: number;
  argv: string[];
}

/** Live processes on the host (all pid namespaces are visible from here) whose argv matches. */
export function hostProcesses(match: (argv: string[]) => boolean): HostProcess[] {
  const out: HostProcess[] = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue;
    let raw: Buffer;
    try {
      raw = readFileSync(`/proc/${name}/cmdline`);
    } catch {
      continue; // exited meanwhile
    }
    if (raw.length === 0) continue; // kernel thread or zombie
    const argv = raw.toString("utf8").replace(/\0$/, "").split("\0");
    if (match(argv)) out.push({ pid: Number(name), argv });
  }
  return out;
}

/** Parent pid and state letter of a process, or null when it is gone. */
export function procStat(pid: number): { ppid: number; state: string } | null {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, "utf8");
    const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
    return { state: fields[0] ?? "?", ppid: Number(fields[1]) };
  } catch {
    return null;
  }
}

/** Alive and not a zombie. */
export function processAlive(pid: number): boolean {
  const s = procStat(pid);
  return s !== null && s.state !== "Z" && s.state !== "X";
}

/** True when `ancestor` is on the ppid chain of `pid`. */
export function descendsFrom(pid: number, ancestor: number): boolean {
  let cur = pid;
  for (let hops = 0; hops < 64 && cur > 1; hops++) {
    const s = procStat(cur);
    if (!s) return false;
    if (s.ppid === ancestor) return true;
    cur = s.ppid;
  }
  return false;
}

/** Names in a directory; a directory that does not exist has none. */
export async function entriesOf(dir: string): Promise<string[]> {
  try {
    return await readdir(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return [];
    throw err;
  }
}

/** Lines of this process's mount table that mention `text` (a sandbox must leave none). */
export function mountsMentioning(text: string): string[] {
  return readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .filter((l) => l.includes(text));
}

/** Polls `check` until it returns true or `timeoutMs` passes; returns the last result. */
export async function waitUntil(
  check: () => boolean | Promise<boolean>,
  timeoutMs: number,
  intervalMs = 50,
): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return true;
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/**
 * Where the store says a workspace's sandbox process is. Read from the store directly,
 * because status() would restart a dead sandbox and hide what we want to observe.
 */
export function sandboxPid(pyro: Pyro, id: string): number | null {
  const sandbox = pyro.engine.store().getWorkspace(id)?.runtime.sandbox as
    | { pid?: unknown }
    | null
    | undefined;
  return typeof sandbox?.pid === "number" ? sandbox.pid : null;
}

/** Starts the built CLI without waiting (for tests that kill it mid-command). */
export function spawnCli(args: string[], env: NodeJS.ProcessEnv): ChildProcess & { output: () => string } {
  const child = spawn(process.execPath, [PYRO_BIN, ...args], {
    env: { ...process.env, PYRO_DEBUG: "", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout?.on("data", (c: Buffer) => {
    out += c.toString("utf8");
  });
  child.stderr?.on("data", (c: Buffer) => {
    out += c.toString("utf8");
  });
  return Object.assign(child, { output: () => out });
}

/** Resolves with the exit code (or signal name) once a child has exited. */
export function exited(child: ChildProcess): Promise<number | string> {
  if (child.exitCode !== null) return Promise.resolve(child.exitCode);
  if (child.signalCode !== null) return Promise.resolve(child.signalCode);
  return new Promise((r) => child.once("exit", (code, sig) => r(code ?? sig ?? -1)));
}

/**
 * Bytes the files under `dir` take on disk (allocated blocks, symlinks not followed):
 * what a workspace's own writes cost the host, unlike the file system's free space,
 * which every test running at the same time changes.
 */
export async function allocatedBytes(dir: string): Promise<number> {
  const { lstat, readdir } = await import("node:fs/promises");
  const { join } = await import("node:path");
  let total = 0;
  const walk = async (d: string): Promise<void> => {
    for (const e of await readdir(d, { withFileTypes: true }).catch(() => [])) {
      const p = join(d, e.name);
      const st = await lstat(p).catch(() => null);
      if (!st) continue;
      total += st.blocks * 512;
      if (st.isDirectory()) await walk(p);
    }
  };
  await walk(dir);
  return total;
}
