import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { askSetupPort, setupRequest } from "../../../src/backends/qemu/setup-port.js";
import { GUEST, SETUP_HELPER } from "../../../src/backends/vm/types.js";
import { type Harness, openHarness, qemuSkipReason, suiteTitle } from "../../helpers/sandbox.js";

/**
 * The setup helper's own port (qemu/setup-port.ts, vm/setup-helper.ts) against the guest
 * driver's ordering: virtio_console learns that a host connected from a control message
 * it handles in a workqueue, while the host's data is readable at once. A helper that
 * runs first reads the request while the port still says no host is there, and its
 * reply cannot be written yet (EAGAIN). A loaded host (a vCPU thread descheduled) made
 * that happen in CI: the reply was dropped and the template build waited 120 s.
 */
const skip = qemuSkipReason();

describe.skipIf(skip !== "")(suiteTitle("qemu setup port", skip), () => {
  let h: Harness;
  beforeAll(async () => {
    h = await openHarness("qemu-setup-port", { backend: "qemu" });
  }, 600_000);
  afterAll(async () => {
    await h?.cleanup();
  }, 120_000);

  it("a request read before the guest saw its host connect is still answered", {
    timeout: 300_000,
  }, async () => {
    const w = await h.create({ vcpus: 1 });
    const sockets = join(h.home, "workspaces", w.workspace_id, "sandbox", "s");
    // The order a loaded host makes by chance, made every time: the helper runs at a
    // real-time priority above a spinning real-time task, which starves the kernel's
    // workqueue (normal priority; the kernel leaves it 50 ms of each second) until it
    // ends. So the "host connected" message is handled after the helper read the request.
    const hog = await h.pyro.execWorkspace(
      w.workspace_id,
      [
        `chrt -f -p 60 $(${GUEST.agentDir}/bin/busybox pidof ${SETUP_HELPER})`,
        // Started a second later: this command's answer gets out first.
        `setsid -f sh -c 'sleep 1; exec chrt -f 50 timeout 10 sh -c "while :; do :; done"' >/dev/null 2>&1`,
      ].join(" && "),
    );
    expect(hog.exit_code, hog.stderr).toBe(0);
    await sleep(2000);
    const replies: string[] = [];
    for (let i = 0; i < 2; i++) {
      const request = setupRequest({
        hostname: "pyro",
        timeMs: Date.now(),
        entropy: randomBytes(64),
        mount: true,
      });
      // The workqueue runs within a second; without the kept reply no answer ever came.
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
  });
});
