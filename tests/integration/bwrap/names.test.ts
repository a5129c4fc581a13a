import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bwrapSkipReason, errorOf, type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";

/** Two named bwrap workspaces side by side: addressing, labels, ordering, and no cross-talk. */
const skip = bwrapSkipReason();

describe.skipIf(skip !== "")(suiteTitle("named workspaces on bwrap", skip), () => {
  let h: Harness;
  let alpha: string;
  let beta: string;
  const pause = () => new Promise((r) => setTimeout(r, 20)); // distinct last_activity_at stamps
  const order = async () => (await h.pyro.listWorkspaces()).workspaces.map((w) => w.name);

  beforeAll(async () => {
    h = await openHarness("names");
    alpha = (await h.create({ name: "alpha", labels: { team: "red", tier: "1" } })).workspace_id;
    beta = (await h.create({ name: "beta", labels: { team: "blue" } })).workspace_id;
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("addresses each workspace by its name as well as its id", async () => {
    expect(await h.pyro.getWorkspace("alpha")).toMatchObject({
      workspace_id: alpha,
      name: "alpha",
      labels: { team: "red", tier: "1" },
      state: "running",
      backend: "bwrap",
    });
    expect(await h.pyro.getWorkspace(beta)).toMatchObject({ workspace_id: beta, name: "beta" });
    expect(await h.pyro.execWorkspace("beta", "echo by-name")).toMatchObject({
      workspace_id: beta,
      stdout: "by-name\n",
    });
    expect((await errorOf(h.create({ name: "alpha" }))).code).toBe("conflict");
  });

  it("updates labels (set and clear) and keeps them across status and list", async () => {
    const updated = await h.pyro.updateWorkspace("alpha", {
      labels: { stage: "review", tier: "2" },
      clearLabels: ["team"],
    });
    expect(updated.labels).toEqual({ stage: "review", tier: "2" });
    expect((await h.pyro.getWorkspace(alpha)).labels).toEqual({ stage: "review", tier: "2" });
    const listed = (await h.pyro.listWorkspaces()).workspaces.find((w) => w.workspace_id === alpha);
    expect(listed?.labels).toEqual({ stage: "review", tier: "2" });
    expect((await h.pyro.getWorkspace("beta")).labels).toEqual({ team: "blue" });
  });

  it("lists the most recently active workspace first", async () => {
    await pause();
    await h.pyro.execWorkspace("alpha", "true");
    expect(await order()).toEqual(["alpha", "beta"]);
    await pause();
    await h.pyro.writeWorkspaceFile("beta", "touch.txt", "x");
    expect(await order()).toEqual(["beta", "alpha"]);
    const list = await h.pyro.listWorkspaces();
    expect(list.count).toBe(2);
    expect(Date.parse(list.workspaces[0]!.last_activity_at)).toBeGreaterThan(
      Date.parse(list.workspaces[1]!.last_activity_at),
    );
    expect(list.workspaces.find((w) => w.name === "alpha")?.command_count).toBeGreaterThanOrEqual(1);
  });

  it("keeps files, processes and hostnames of the two apart", async () => {
    await h.pyro.writeWorkspaceFile("alpha", "only-in-alpha.txt", "alpha's\n");
    await h.pyro.execWorkspace("alpha", "nohup sleep 300 >/dev/null 2>&1 &");
    expect((await errorOf(h.pyro.readWorkspaceFile("beta", "only-in-alpha.txt"))).code).toBe("not_found");
    expect((await h.pyro.execWorkspace("beta", "test -e /workspace/only-in-alpha.txt")).exit_code).toBe(1);
    expect((await h.pyro.diffWorkspace("beta")).entries).toEqual([{ path: "touch.txt", status: "added" }]);
    const betaProcs = await h.pyro.execWorkspace("beta", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '");
    expect(betaProcs.stdout).not.toContain("sleep 300");
    expect((await h.pyro.execWorkspace("alpha", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")).stdout).toContain(
      "sleep 300",
    );
    const [ha, hb] = await Promise.all([
      h.pyro.execWorkspace("alpha", "hostname"),
      h.pyro.execWorkspace("beta", "hostname"),
    ]);
    expect(ha.stdout).not.toBe(hb.stdout);
  });

  it("answers workspace_not_found for an unknown id or name, and deleting one leaves the other", async () => {
    expect((await errorOf(h.pyro.execWorkspace("ws_000000000000", "true"))).code).toBe("workspace_not_found");
    expect((await errorOf(h.pyro.getWorkspace("gamma"))).code).toBe("workspace_not_found");
    expect((await errorOf(h.pyro.deleteWorkspace("gamma"))).code).toBe("workspace_not_found");
    await h.pyro.deleteWorkspace("alpha");
    expect((await errorOf(h.pyro.execWorkspace("alpha", "true"))).code).toBe("workspace_not_found");
    expect((await h.pyro.execWorkspace("beta", "cat touch.txt")).stdout).toBe("x");
    expect(await order()).toEqual(["beta"]);
  });
});
