import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CgroupLimits, hostCgroups } from "../../../src/backends/linux/cgroups.js";
import { prepareNodeRuntime } from "../../../src/backends/runtime.js";
import {
  bwrapSkipReason,
  type Harness,
  hostProcesses,
  openHarness,
  suiteTitle,
  waitUntil,
} from "../../helpers/sandbox.js";

/**
 * The memory an idle workspace's agent holds (issue 18: 50 idle workspaces in 1.5 GiB),
 * measured on a real bwrap workspace against an idle `node` started from the same
 * injected runtime, read in the same test. RSS, not timing: it does not move with load.
 *
 * The bound is the idle node plus AGENT_BUDGET_MIB, not issue 18's 30 MiB: node alone is
 * 39.8 MiB of RSS here, ~34 MiB of it the node binary's pages, which every agent shares
 * through the page cache (docs/backends.md, "Agent memory"). The agent measured 7.2-7.9
 * MiB above it after serving requests (47.0-47.8 MiB; bundled, zod's mini build). The
 * budget leaves ~6 MiB for the spread of readings and small growth; 8 MiB more held at
 * idle fails it (checked with an 8 MiB buffer added to the agent: 15.3 MiB over node),
 * as would a return of the full zod build (+14 MiB measured).
 */
const AGENT_BUDGET_MIB = 14;

const skip = bwrapSkipReason();

function rssMib(pid: number): number {
  const rollup = readFileSync(`/proc/${pid}/smaps_rollup`, "utf8");
  return Number(/^Rss:\s+(\d+) kB/m.exec(rollup)?.[1] ?? Number.NaN) / 1024;
}

/** The median of a few readings a little apart, after a second to settle (start-up or the last request). */
async function settledRssMib(pid: number): Promise<number> {
  await new Promise((r) => setTimeout(r, 1000));
  const readings: number[] = [];
  for (let i = 0; i < 5; i++) {
    readings.push(rssMib(pid));
    await new Promise((r) => setTimeout(r, 300));
  }
  return readings.sort((a, b) => a - b)[2]!;
}

describe.skipIf(skip !== "")(suiteTitle("an idle bwrap workspace's agent memory", skip), () => {
  let h: Harness;
  let idleNode: ChildProcess | undefined;

  beforeAll(async () => {
    h = await openHarness("agent-memory");
  });
  afterAll(async () => {
    idleNode?.kill("SIGKILL");
    await h?.cleanup();
  });

  it("holds at most an idle node's RSS plus the agent's budget after serving requests", async () => {
    const w = await h.create();
    for (let i = 0; i < 5; i++)
      expect((await h.pyro.execWorkspace(w.workspace_id, "echo hi")).exit_code).toBe(0);
    await h.pyro.listWorkspaceFiles(w.workspace_id, "/workspace");
    const agents = hostProcesses(
      // The agent itself (started through the runtime's loader, its execute-only copy
      // ld-exec-only.so on bwrap, or node), not the launcher
      // shells and bwrap that carry the same argv.
      (argv) =>
        /(\/ld-[^/]*\.so(\.\d+)?|\/node)$/.test(argv[0] ?? "") &&
        argv.some((a) => a.endsWith("/agent/bundle/main.js")),
    ).filter((p) => {
      const cgroup = readFileSync(`/proc/${p.pid}/cgroup`, "utf8");
      return cgroup.includes(w.workspace_id);
    });
    expect(agents).toHaveLength(1);
    const agentMib = await settledRssMib(agents[0]!.pid);

    // The floor: the same node binary, loader and libraries, doing nothing.
    const runtime = await prepareNodeRuntime(join(h.home, "runtime"));
    const [cmd, ...args] = runtime.argv(runtime.dir, "-e", "setInterval(() => {}, 1 << 30)");
    idleNode = spawn(cmd!, args, { stdio: "ignore" });
    const nodePid = idleNode.pid!;
    // Ready once its event loop runs (the timer is armed after start-up).
    await waitUntil(() => readFileSync(`/proc/${nodePid}/status`, "utf8").includes("State:\tS"), 10_000);
    const nodeMib = await settledRssMib(nodePid);

    const report = `agent ${agentMib.toFixed(1)} MiB, idle node ${nodeMib.toFixed(1)} MiB`;
    expect(agentMib - nodeMib, report).toBeLessThanOrEqual(AGENT_BUDGET_MIB);
  });

  it("fits 50 idle workspaces in 1.5 GiB, by what their memory cgroups are charged", async () => {
    // Issue 18's requirement itself: IDLE workspaces are started and what the kernel bills
    // each (anonymous memory, page cache it brought in, kernel memory) is read from its
    // memory cgroup. The first may carry pages all share (the node binary's, when nothing
    // read them before); the rest cost what one more workspace costs. Extrapolated to 50:
    // the ones measured plus the median for each missing one. Measured here: 12 MiB each
    // (bench: "memory per idle workspace"); an agent that no longer shared node's pages
    // (+34 MiB each) or held 20 MiB more would fail it.
    const ids: string[] = [];
    for (let i = 0; i < IDLE; i++) {
      const w = await h.create();
      expect((await h.pyro.execWorkspace(w.workspace_id, "true")).exit_code).toBe(0);
      ids.push(w.workspace_id);
    }
    await new Promise((r) => setTimeout(r, 1000));
    const mib = await Promise.all(ids.map(chargedMib));
    if (mib.some((m) => m === null)) {
      // No memory controller to read (a bwrap workspace without cgroup limits cannot be
      // started here, so this would be a broken machine, not a skip).
      throw new Error(`no memory cgroup for a workspace: ${JSON.stringify(mib)}`);
    }
    const each = (mib as number[]).slice().sort((a, b) => a - b);
    const fifty = each.reduce((a, b) => a + b, 0) + (50 - IDLE) * each[IDLE >> 1]!;
    expect(fifty, `charged MiB: ${each.map((m) => m.toFixed(1)).join(", ")}`).toBeLessThanOrEqual(1536);
  });
});

/** Idle workspaces the 50-workspace test starts. */
const IDLE = 5;

/** What the workspace's memory cgroup is charged, MiB, or null without one. */
async function chargedMib(id: string): Promise<number | null> {
  const cg = await CgroupLimits.attach(await hostCgroups(), id);
  const bytes = cg ? (await cg.stats()).memory_bytes : null;
  return bytes === null ? null : bytes / 1048576;
}
