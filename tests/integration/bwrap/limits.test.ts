import { readFile } from "node:fs/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bwrapSkipReason, type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";

/** A workspace at its pids limit: the bomb ends with its call and the workspace answers after. */
const skip = bwrapSkipReason();
const BOMB = ":(){ :|:& };:";

describe.skipIf(skip !== "")(suiteTitle("limits on bwrap", skip), () => {
  let h: Harness;
  let id: string;
  let baseline: number;
  const tasks = async () =>
    Number(await readFile(`/sys/fs/cgroup/pids/pyro/${id}/pids.current`, "utf8").catch(() => "NaN"));

  beforeAll(async () => {
    h = await openHarness("limits");
    id = (await h.create()).workspace_id;
    baseline = await tasks();
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("runs commands under SCHED_IDLE, so the agent always gets the CPU it asks for", async () => {
    const r = await h.pyro.execWorkspace(id, "chrt -p $$");
    expect(r.stdout).toContain("SCHED_IDLE");
  });

  it("ends a fork bomb with the call that started it, and the next call answers", async () => {
    const r = await h.pyro.execWorkspace(id, `bash -c '${BOMB}'`, { timeoutSeconds: 20 });
    expect(r.exit_code).toBe(0);
    if (Number.isFinite(baseline)) expect(await tasks()).toBeLessThanOrEqual(baseline + 2);
    const next = await h.pyro.execWorkspace(id, "echo alive", { timeoutSeconds: 20 });
    expect(next.stdout).toBe("alive\n");
  });

  it("kills a fork bomb still running at the timeout, and the next call answers", async () => {
    const r = await h.pyro.execWorkspace(id, `bash -c '${BOMB}; sleep 100' 2>/dev/null`, { timeoutSeconds: 5 });
    expect(r.timed_out).toBe(true);
    // The timer fires on time although a thousand processes want the CPU (SCHED_IDLE).
    expect(r.duration_ms).toBeLessThan(15_000);
    if (Number.isFinite(baseline)) expect(await tasks()).toBeLessThanOrEqual(baseline + 2);
    const next = await h.pyro.execWorkspace(id, "echo alive", { timeoutSeconds: 20 });
    expect(next.stdout).toBe("alive\n");
  });
});
