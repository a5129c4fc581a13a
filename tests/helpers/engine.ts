import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "vitest";
import { FakeBackend } from "../../src/backends/fake/backend.js";
import { PyroError } from "../../src/errors.js";
import { Pyro } from "../../src/sdk/pyro.js";
import { FakeBuilder } from "./fake-builder.js";

/** An SDK client on a temp home with a fake environment builder and the in-process fake backend. */
export async function fakePyro(): Promise<{
  pyro: Pyro;
  backend: FakeBackend;
  home: string;
  /** XDG_CONFIG_HOME of the engine: the secrets key lives there, outside the home. */
  configHome: string;
  cleanup: () => Promise<void>;
}> {
  const home = await mkdtemp(join(tmpdir(), "pyro-core-"));
  const configHome = await mkdtemp(join(tmpdir(), "pyro-config-"));
  const backend = new FakeBackend("bwrap");
  const pyro = new Pyro({
    home,
    environmentsDir: join(home, "envs"),
    builders: [new FakeBuilder()],
    backends: { bwrap: backend },
    // The fake stands in for bwrap: pin it, or a real stronger backend (gvisor) would win.
    env: { PYRO_BACKEND: "bwrap", XDG_CONFIG_HOME: configHome },
  });
  return {
    pyro,
    backend,
    home,
    configHome,
    cleanup: async () => {
      await pyro.close();
      await backend.closeAll();
      await rm(home, { recursive: true, force: true });
      await rm(configHome, { recursive: true, force: true });
    },
  };
}

/** The `code` of the PyroError a promise rejects with (fails the test if it resolves). */
export async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(PyroError);
    return (err as PyroError).code;
  }
  throw new Error("expected a failure");
}
