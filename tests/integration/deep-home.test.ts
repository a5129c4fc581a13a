import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { BackendName } from "../../src/backends/backend.js";
import { Pyro } from "../../src/sdk/pyro.js";
import { dockerSkipReason, type TestEngine, useTestEngine } from "../helpers/docker.js";
import {
  bwrapSkipReason,
  ENV_CACHE,
  gvisorSkipReason,
  hostSkipReason,
  qemuSkipReason,
  suiteTitle,
} from "../helpers/sandbox.js";

/**
 * A deep PYRO_HOME: every socket a backend uses (the agent's, its host-side link, QEMU's
 * QMP and serial ports) then has a path longer than a socket address holds (107 bytes).
 * Found by running the README as a new user would: a home under a longer temp directory
 * made every gVisor start time out after 30 s, host-compat after 15 s, and QEMU refuse to
 * start. Each backend must create, run and delete there as anywhere else.
 */
const BACKENDS: Array<[BackendName, () => string]> = [
  ["bwrap", bwrapSkipReason],
  ["gvisor", gvisorSkipReason],
  ["host", hostSkipReason],
  ["qemu", qemuSkipReason],
  ["docker", dockerSkipReason],
];

for (const [backend, skipReason] of BACKENDS) {
  const skip = skipReason();
  describe.skipIf(skip !== "")(
    suiteTitle(`a PYRO_HOME deeper than a socket address on ${backend}`, skip),
    () => {
      let root: string;
      let home: string;
      let engine: TestEngine | null = null;
      let pyro: Pyro;
      beforeAll(async () => {
        root = await mkdtemp(join(tmpdir(), "pyro-deep-"));
        home = join(root, "a-directory-name-long-enough".repeat(3), "pyro-home");
        await mkdir(home, { recursive: true });
        if (backend === "docker") engine = await useTestEngine();
        pyro = new Pyro({
          home,
          environmentsDir: ENV_CACHE,
          env: { ...process.env, ...(engine?.env ?? {}) },
        });
      });
      afterAll(async () => {
        for (const w of (await pyro?.listWorkspaces())?.workspaces ?? [])
          await pyro.deleteWorkspace(w.workspace_id);
        await pyro?.close();
        await engine?.release();
        await rm(root, { recursive: true, force: true });
      });

      it("creates, runs commands, restarts and deletes a workspace", async () => {
        const w = await pyro.createWorkspace({ backend, allowHostCompat: backend === "host" });
        // The socket the agent listens on would not fit a socket address.
        expect(
          Buffer.byteLength(join(home, "workspaces", w.workspace_id, "sandbox", "sock", "agent.sock")),
        ).toBeGreaterThan(107);
        expect((await pyro.execWorkspace(w.workspace_id, "echo ok")).stdout).toBe("ok\n");
        await pyro.stopWorkspace(w.workspace_id);
        await pyro.startWorkspace(w.workspace_id);
        expect((await pyro.execWorkspace(w.workspace_id, "echo again")).stdout).toBe("again\n");
        await pyro.deleteWorkspace(w.workspace_id);
        expect((await pyro.listWorkspaces()).count).toBe(0);
      }, 240_000);
    },
  );
}
