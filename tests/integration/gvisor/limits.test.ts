import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { gvisorSkipReason, type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";

/** gVisor's writable layers in a disk image: ENOSPC at the limit, the workspace usable after. */
const skip = gvisorSkipReason();

describe.skipIf(skip !== "")(suiteTitle("disk limit on gvisor", skip), () => {
  let h: Harness;
  beforeAll(async () => {
    h = await openHarness("gvisor-limits", { backend: "gvisor" });
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("stops a command at the disk limit with ENOSPC and keeps the workspace usable", async () => {
    const id = (await h.create({ diskMib: 128 })).workspace_id;
    const r = await h.pyro.execWorkspace(id, "dd if=/dev/zero of=/workspace/big bs=1M count=400; echo dd=$?");
    expect(r.stderr).toMatch(/No space left on device/);
    expect(r.stdout).toContain("dd=1");
    const after = await h.pyro.execWorkspace(
      id,
      "rm /workspace/big && ls -l /etc/ld.so.preload >/dev/null && echo fine",
    );
    expect(after.stdout).toBe("fine\n");
  });
});
