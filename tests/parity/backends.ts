import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { BackendName } from "../../src/backends/backend.js";
import { FakeBackend } from "../../src/backends/fake/backend.js";
import { Pyro } from "../../src/sdk/pyro.js";
import { isRoot } from "../helpers/cli.js";
import { FakeBuilder } from "../helpers/fake-builder.js";
import { ENV_CACHE, envCacheSkipReason, onPath, qemuSkipReason } from "../helpers/sandbox.js";

/** One backend under test: how to get a client for it, and why it can't run here. */
export interface ParityTarget {
  /** Display name; "fake" is the in-process fake under the bwrap name. */
  label: string;
  backend: BackendName;
  /** Real sandboxes can be driven from other processes (CLI, killed creators). */
  real: boolean;
  skip: string;
  open(): Promise<{ pyro: Pyro; home: string; cliEnv: NodeJS.ProcessEnv; close(): Promise<void> }>;
}

const implemented = new Set(new Pyro({ env: {} }).engine.implemented());

function realSkip(name: BackendName): string {
  if (!implemented.has(name)) return `the ${name} backend is not implemented in this build`;
  if (envCacheSkipReason()) return envCacheSkipReason();
  switch (name) {
    case "bwrap":
      if (!isRoot) return "needs root (overlay mounts, cgroups)";
      return onPath("bwrap") ? "" : "bubblewrap is not installed";
    case "gvisor":
      if (!isRoot) return "needs root (runsc)";
      return onPath("runsc") ? "" : "runsc is not installed";
    case "qemu":
      return qemuSkipReason();
    case "docker": {
      const host = process.env.DOCKER_HOST ?? "unix:///var/cache/pyro-ci/docker/docker.sock";
      if (!host.startsWith("unix://") || !existsSync(host.slice(7)))
        return `no Docker engine socket at ${host} (start one with scripts/dockerd-test)`;
      const ping = spawnSync("curl", ["-sf", "--unix-socket", host.slice(7), "http://d/_ping"], {
        encoding: "utf8",
      });
      return ping.stdout === "OK" ? "" : `the Docker engine at ${host} does not answer`;
    }
    default:
      return "";
  }
}

function realTarget(name: BackendName): ParityTarget {
  return {
    label: name,
    backend: name,
    real: true,
    skip: realSkip(name),
    async open() {
      const home = await mkdtemp(join(tmpdir(), `pyro-parity-${name}-`));
      const dockerHost = process.env.DOCKER_HOST ?? "unix:///var/cache/pyro-ci/docker/docker.sock";
      const env = {
        ...process.env,
        ...(name === "docker" ? { DOCKER_HOST: dockerHost } : {}),
        PARITY_HOST_VAR: "from-the-host-env",
      };
      // The proxy's test-only map (docs/network.md): these names reach the tests' loopback servers.
      const networkTestHosts = { "allowed.test": "127.0.0.1", "blocked.test": "127.0.0.1" };
      const pyro = new Pyro({ home, environmentsDir: ENV_CACHE, env, networkTestHosts });
      const cliEnv = {
        PYRO_HOME: home,
        PYRO_ENV_CACHE: ENV_CACHE,
        ...(name === "docker" ? { DOCKER_HOST: dockerHost } : {}),
      };
      return { pyro, home, cliEnv, close: () => pyro.close() };
    },
  };
}

export function parityTargets(): ParityTarget[] {
  const fake: ParityTarget = {
    label: "fake",
    backend: "bwrap",
    real: false,
    skip: "",
    async open() {
      const home = await mkdtemp(join(tmpdir(), "pyro-parity-fake-"));
      const backend = new FakeBackend("bwrap");
      const pyro = new Pyro({
        home,
        environmentsDir: join(home, "envs"),
        builders: [new FakeBuilder()],
        backends: { bwrap: backend },
        env: { PARITY_HOST_VAR: "from-the-host-env" },
      });
      return {
        pyro,
        home,
        cliEnv: {},
        close: async () => {
          await pyro.close();
          await backend.closeAll();
        },
      };
    },
  };
  return [
    fake,
    realTarget("bwrap"),
    realTarget("gvisor"),
    realTarget("qemu"),
    realTarget("docker"),
    realTarget("host"),
  ];
}
