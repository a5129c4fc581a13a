import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AgentClient } from "../../../src/agent/client.js";
import { connectPort } from "../../../src/backends/qemu/ports.js";
import { describeSetupHelper } from "../../../src/backends/qemu/setup-diagnosis.js";
import { askSetupPort, setupRequest } from "../../../src/backends/qemu/setup-port.js";
import { GUEST, SETUP_HELPER } from "../../../src/backends/vm/types.js";
import { type Harness, openHarness, qemuSkipReason, suiteTitle } from "../../helpers/sandbox.js";

/**
 * The guest's servers on virtio-serial ports (the setup helper's own port: vm/setup-helper.ts;
 * the agent's ports: agent/guest/serial.ts) against the guest driver's ordering:
 * virtio_console learns that a host connected from a control message it handles in a
 * workqueue, while the host's bytes are readable at once. A server that runs first reads
 * the request while the port still says no host is there, and cannot answer yet
 * (EAGAIN). A loaded host (a vCPU thread descheduled) made that happen in CI: the
 * helper dropped its reply and a template build waited 120 s for it.
 *
 * Each test forces that order: the server runs at a real-time priority above a spinning
 * real-time task that starves the kernel's workqueue (normal priority; the kernel leaves
 * it 50 ms of each second) for HOG_S seconds, so a host's connect is handled well after
 * its bytes are read.
 */
const skip = qemuSkipReason();
const HOG_S = 12;
const SLOW = { timeout: 300_000 };
const B = `${GUEST.agentDir}/bin/busybox`;

/** Shell: the pids of the guest's agent (its Node runtime) processes. */
const AGENT_PIDS = `for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline 2>/dev/null | grep -q '^${GUEST.agentDir}/runtime' && echo \${d#/proc/}; done`;

describe.skipIf(skip !== "")(
  suiteTitle("qemu guest ports: a host's bytes before its connect is seen", skip),
  () => {
    let h: Harness;
    beforeAll(async () => {
      h = await openHarness("qemu-guest-ports", { backend: "qemu" });
    }, 600_000);
    afterAll(async () => {
      await h?.cleanup();
    }, 120_000);

    /** A new workspace whose processes `pids` (shell) run above a workqueue-starving task, starting a second later. */
    async function starved(pids: string): Promise<{ id: string; sockets: string }> {
      const w = await h.create({ vcpus: 1 });
      const r = await h.pyro.execWorkspace(
        w.workspace_id,
        [
          // The main thread (the agent's event loop): Node's other threads at that priority
          // would leave the rest of the guest 50 ms a second whenever they spin.
          `for p in $(${pids}); do chrt -f -p 60 $p >/dev/null || exit 1; done`,
          // Started a second later, so this command's answer gets out first; bounded by its own clock.
          `setsid -f sh -c 'sleep 1; exec chrt -f 50 bash -c "while [ \\$SECONDS -lt ${HOG_S} ]; do :; done"' >/dev/null 2>&1`,
        ].join(" && "),
      );
      expect(r.exit_code, r.stderr).toBe(0);
      await sleep(2000);
      return { id: w.workspace_id, sockets: join(h.home, "workspaces", w.workspace_id, "sandbox", "s") };
    }

    it("the setup helper answers a request it read before the guest saw its host connect", SLOW, async () => {
      // The agent too: the command's answer then gets out even if the spinning task starts first.
      const { id, sockets } = await starved(`${B} pidof ${SETUP_HELPER}; ${AGENT_PIDS}`);
      const replies: string[] = [];
      for (let i = 0; i < 2; i++) {
        const request = setupRequest({
          hostname: "pyro",
          timeMs: Date.now(),
          entropy: randomBytes(64),
          mount: true,
        });
        // The workqueue runs within a second; with the reply dropped none ever came.
        replies.push(
          await askSetupPort(sockets, request, { timeoutMs: 15_000 }).then(
            (mounted) => `ok mounted=${mounted}`,
            (err: Error) => err.message,
          ),
        );
        await sleep(300);
      }
      // /workspace was mounted at the start: each request finds it so.
      expect(replies).toEqual(["ok mounted=false", "ok mounted=false"]);
      // Ends its spinning task now, not at the suite's end (it burns a host core under TCG).
      await h.pyro.deleteWorkspace(id);
    });

    it("the agent answers a handshake it read before the guest saw its host connect", SLOW, async () => {
      const { id, sockets } = await starved(AGENT_PIDS);
      const results: string[] = [];
      // New connections, each on a port no host used yet (what a restored start's first ones are).
      for (let i = 0; i < 3; i++) {
        results.push(
          await (async () => {
            const client = await AgentClient.connect(await connectPort(sockets, 10_000), {
              timeoutMs: 15_000,
            });
            await client.request("ping", {});
            await client.close();
            return "ok";
          })().catch((err: Error) => err.message),
        );
      }
      expect(results).toEqual(["ok", "ok", "ok"]);
      // What a setup port's timeout error would say of the helper (setup-diagnosis.ts): its
      // server waiting with the port open, and the ports by name.
      const seen = await describeSetupHelper(() => connectPort(sockets, 10_000));
      expect(seen).toMatch(/^helper \d+: state S wchan \S+ fds .*\/dev\/vport\d+p\d+/);
      expect(seen).toMatch(/ vport\d+p\d+=pyro\.setup /);
      await h.pyro.deleteWorkspace(id);
    });
  },
);
