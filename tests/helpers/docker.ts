import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, readdir, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import Docker from "dockerode";
import { acquireLock } from "../../src/util/lock.js";
import { isRoot, REPO_ROOT } from "./cli.js";
import { envCacheSkipReason, onPath } from "./sandbox.js";

/**
 * The private Docker engine of the docker suites (scripts/dockerd-test): its socket lives
 * outside the clone. Several test files (vitest workers) share it through leases: the
 * first one starts it if nothing runs there, and the last one out stops it, but only
 * if a test started it (an engine someone started by hand is left alone).
 */
export const TEST_DOCKER_DIR = process.env.PYRO_DOCKERD_DIR ?? "/var/cache/pyro-ci/docker";
export const TEST_DOCKER_HOST = `unix://${TEST_DOCKER_DIR}/docker.sock`;
const SCRIPT = join(REPO_ROOT, "scripts", "dockerd-test");
const LEASES = join(TEST_DOCKER_DIR, "leases");
const STARTED_BY_TESTS = join(TEST_DOCKER_DIR, "started-by-tests");

/** Why the docker suites cannot run on this host, or "" when they can. */
export function dockerSkipReason(): string {
  if (!isRoot) return "needs root: the suite starts its own dockerd";
  if (!onPath("dockerd") && !existsSync("/usr/sbin/dockerd"))
    return "dockerd is not installed (Debian package docker.io)";
  return envCacheSkipReason();
}

export interface TestEngine {
  /** Environment that points pyro (SDK and CLI) at the engine. */
  env: { DOCKER_HOST: string };
  /** A client for assertions about containers, volumes and images. */
  docker: Docker;
  release(): Promise<void>;
}

function script(arg: string): { code: number; out: string } {
  const r = spawnSync("bash", [SCRIPT, arg], {
    encoding: "utf8",
    timeout: 60_000,
    env: { ...process.env, PYRO_DOCKERD_DIR: TEST_DOCKER_DIR },
  });
  return { code: r.status ?? -1, out: `${r.stdout}${r.stderr}`.trim() };
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Takes a lease on the test engine, starting it when nothing answers on its socket. */
export async function useTestEngine(): Promise<TestEngine> {
  await mkdir(LEASES, { recursive: true });
  const lease = join(LEASES, `${process.pid}-${randomBytes(4).toString("hex")}`);
  const release = await acquireLock(join(TEST_DOCKER_DIR, "lease.lock"), { timeoutMs: 120_000 });
  try {
    if (script("status").code !== 0) {
      const started = script("start");
      if (started.code !== 0) throw new Error(`scripts/dockerd-test start failed: ${started.out}`);
      await writeFile(STARTED_BY_TESTS, `${process.pid}\n`);
    }
    await writeFile(lease, `${process.pid}\n`);
  } finally {
    await release();
  }
  const docker = new Docker({ socketPath: TEST_DOCKER_HOST.slice("unix://".length) });
  return {
    env: { DOCKER_HOST: TEST_DOCKER_HOST },
    docker,
    release: async () => {
      const unlock = await acquireLock(join(TEST_DOCKER_DIR, "lease.lock"), { timeoutMs: 120_000 });
      try {
        await rm(lease, { force: true });
        const others = (await readdir(LEASES)).filter((name) => {
          const pid = Number(name.split("-")[0]);
          return Number.isInteger(pid) && alive(pid);
        });
        if (others.length === 0 && existsSync(STARTED_BY_TESTS)) {
          const stopped = script("stop");
          await rm(STARTED_BY_TESTS, { force: true });
          if (stopped.code !== 0) throw new Error(`scripts/dockerd-test stop failed: ${stopped.out}`);
        }
      } finally {
        await unlock();
      }
    },
  };
}

/** Containers (running or not) carrying a label, optionally with a value. */
export async function containersLabelled(docker: Docker, label: string, value?: string) {
  return docker.listContainers({
    all: true,
    filters: { label: [value === undefined ? label : `${label}=${value}`] },
  });
}

/** Image ids of every pyro-env image on the engine. */
export async function pyroImages(docker: Docker): Promise<string[]> {
  const images = await docker.listImages({ filters: { reference: ["pyro-env"] } });
  return images.map((i) => i.Id).sort();
}

/** The container a docker workspace runs in, as recorded in the store. */
export function containerIdOf(
  pyro: { engine: { store(): { getWorkspace(id: string): { runtime: { sandbox?: unknown } } | null } } },
  id: string,
): string | null {
  const s = pyro.engine.store().getWorkspace(id)?.runtime.sandbox as
    | { container_id?: unknown }
    | null
    | undefined;
  return typeof s?.container_id === "string" ? s.container_id : null;
}
