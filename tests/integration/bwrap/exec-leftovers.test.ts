import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bwrapSkipReason, type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";

/**
 * What a command leaves running, in a real sandbox: there the agent's /proc holds a
 * handful of processes, so its scans after each command take the synchronous path
 * (proctree.ts SYNC_SCAN_MAX), where the unit tests on the host's /proc take the async
 * one. A background job ends with its call; nohup and setsid outlive it.
 */
const skip = bwrapSkipReason();

describe.skipIf(skip !== "")(suiteTitle("exec leftovers on bwrap", skip), () => {
  let h: Harness;
  let id: string;
  const running = async (pattern: string) =>
    (await h.pyro.execWorkspace(id, `cat /proc/[0-9]*/cmdline | tr '\\0' ' '`)).stdout.includes(pattern);

  beforeAll(async () => {
    h = await openHarness("exec-leftovers");
    id = (await h.create()).workspace_id;
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("ends a background job when its call returns", async () => {
    const r = await h.pyro.execWorkspace(id, "sleep 301 & sleep 302 & true");
    expect(r.exit_code).toBe(0);
    expect(await running("sleep 301")).toBe(false);
    expect(await running("sleep 302")).toBe(false);
  });

  it("keeps what asked to outlive the call: nohup and setsid", async () => {
    await h.pyro.execWorkspace(id, "nohup sleep 303 >/dev/null 2>&1 & setsid sleep 304 >/dev/null 2>&1 &");
    expect(await running("sleep 303")).toBe(true);
    expect(await running("sleep 304")).toBe(true);
  });

  it("ends a background job that left the command's process group", async () => {
    // Out of the group the hangup signals at once, still in the session: the scan finds it.
    const r = await h.pyro.execWorkspace(id, `perl -e 'setpgrp(0, 0); exec "sleep", "305"' & sleep 0.2`);
    expect(r.exit_code).toBe(0);
    expect(await running("sleep 305")).toBe(false);
  });
});
