import { readdir } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pyro as cli } from "../../helpers/cli.js";
import {
  bwrapSkipReason,
  descendsFrom,
  errorOf,
  exited,
  type Harness,
  hostProcesses,
  mountsMentioning,
  openHarness,
  processAlive,
  sandboxPid,
  spawnCli,
  suiteTitle,
  waitUntil,
  writeTree,
} from "../../helpers/sandbox.js";

/**
 * A workspace outlives the process that made it: created by one CLI process, used and
 * reset by others, survives a CLI killed mid-command and a sandbox that died, and is
 * finally deleted through the SDK. The tests follow that one workspace in order.
 */
const skip = bwrapSkipReason();

describe.skipIf(skip !== "")(suiteTitle("a bwrap workspace across processes", skip), () => {
  let h: Harness;
  let id = "";
  let env: NodeJS.ProcessEnv;
  const sandboxOf = (pid: number | null) => (p: { pid: number }) => pid !== null && descendsFrom(p.pid, pid);

  beforeAll(async () => {
    h = await openHarness("resume");
    env = h.cliEnv;
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("keeps running after the CLI process that created it exits, and serves the next process from the same sandbox", async () => {
    const seed = join(await h.tempDir("resume-seed"), "seed");
    await writeTree(seed, { "keep.txt": "kept\n" });
    const created = cli(
      [
        "workspace",
        "create",
        "debian:12",
        "--backend",
        "bwrap",
        "--seed-path",
        seed,
        "--name",
        "resumable",
        "--id-only",
      ],
      env,
    );
    expect(created.code, created.stderr).toBe(0);
    id = created.stdout.trim();
    const pid = sandboxPid(h.pyro, id);
    expect(pid, `workspace ${id} has no sandbox pid`).not.toBeNull();
    expect(processAlive(pid!), `sandbox of ${id} died with its creator`).toBe(true);

    const ran = cli(
      ["workspace", "exec", "resumable", "--", "sh", "-c", "echo from-b > b.txt; cat keep.txt"],
      env,
    );
    expect(ran.code, `workspace ${id}: ${ran.stderr}`).toBe(0);
    expect(ran.stdout).toBe("kept\n");
    expect(sandboxPid(h.pyro, id)).toBe(pid);
    expect(processAlive(pid!)).toBe(true);
  });

  it("shows edits made by other processes to this one, and a reset by another process to all", async () => {
    const wrote = cli(["workspace", "file", "write", id, "notes.txt", "--text", "from c\n", "--json"], env);
    expect(wrote.code, `workspace ${id}: ${wrote.stderr}`).toBe(0);
    expect((await h.pyro.readWorkspaceFile("resumable", "notes.txt")).content).toBe("from c\n");
    expect((await h.pyro.diffWorkspace(id)).entries).toEqual([
      { path: "b.txt", status: "added" },
      { path: "notes.txt", status: "added" },
    ]);

    const reset = cli(["workspace", "reset", id, "--json"], env);
    expect(reset.code, `workspace ${id}: ${reset.stderr}`).toBe(0);
    expect(reset.json()).toMatchObject({ reset_count: 1 });
    expect((await h.pyro.execWorkspace(id, "ls -A")).stdout).toBe("keep.txt\n");
    expect((await h.pyro.getWorkspace(id)).reset_count).toBe(1);
    expect((await h.pyro.workspaceLogs(id)).commands.map((c) => c.command)).toContain(
      "sh -c 'echo from-b > b.txt; cat keep.txt'",
    );
  });

  it("stays usable after a CLI process is SIGKILLed in the middle of an exec, and the interrupted command is killed", async () => {
    const pid = sandboxPid(h.pyro, id);
    const isSleep30 = (argv: string[]) => argv[0]?.endsWith("sleep") === true && argv[1] === "30";
    const child = spawnCli(["workspace", "exec", id, "--", "sleep", "30"], env);
    const running = await waitUntil(() => hostProcesses(isSleep30).some(sandboxOf(pid)), 15_000);
    expect(running, `sleep 30 never started in workspace ${id}: ${child.output()}`).toBe(true);
    child.kill("SIGKILL");
    expect(await exited(child)).toBe("SIGKILL");

    // The agent sees its client vanish and cancels the command with its whole tree.
    const gone = await waitUntil(() => !hostProcesses(isSleep30).some(sandboxOf(pid)), 5_000);
    expect(gone, `sleep 30 survived its killed client in workspace ${id}`).toBe(true);
    const next = cli(["workspace", "exec", id, "--", "echo", "alive"], env, 30_000);
    expect(next.code, `workspace ${id}: ${next.stderr}`).toBe(0);
    expect(next.stdout).toBe("alive\n");
    expect((await h.pyro.execWorkspace(id, "echo sdk-alive")).stdout).toBe("sdk-alive\n");
    expect(sandboxPid(h.pyro, id)).toBe(pid);
  });

  it("restarts a sandbox that died while no process was attached, on its kept files", async () => {
    await h.pyro.writeWorkspaceFile(id, "survivor.txt", "on the writable layer\n");
    const pid = sandboxPid(h.pyro, id)!;
    // The agent itself, not the bwrap processes or the launch shells (which hold the
    // capped log's pipe) whose argv carries its command line.
    const isAgent = (argv: string[]) =>
      !argv[0]?.endsWith("bwrap") &&
      !argv.includes("pyro-launch") &&
      argv.some((a) => a.endsWith("/dist/agent/bundle/main.js"));
    const agents = hostProcesses(isAgent).filter(sandboxOf(pid));
    expect(agents, `agent of workspace ${id}`).toHaveLength(1);
    // The sandbox was last started by the CLI reset above, which has exited: nobody is
    // attached, and where pid 1 does not reap, the dead sandbox lingers as a zombie.
    process.kill(agents[0]!.pid, "SIGKILL");
    expect(
      await waitUntil(() => !processAlive(pid), 5_000),
      `sandbox ${pid} of ${id} outlived its agent`,
    ).toBe(true);

    const next = cli(["workspace", "exec", id, "--", "cat", "survivor.txt", "keep.txt"], env, 60_000);
    expect(next.stderr).toBe("");
    expect(next.code, `workspace ${id}`).toBe(0);
    expect(next.stdout).toBe("on the writable layer\nkept\n");
    const restarted = sandboxPid(h.pyro, id);
    expect(restarted).not.toBe(pid);
    expect(processAlive(restarted!)).toBe(true);
  });

  it("is deleted by this process through the SDK, leaving no record, directory, process or mount", async () => {
    const pid = sandboxPid(h.pyro, id)!;
    expect(await h.pyro.deleteWorkspace("resumable")).toMatchObject({ workspace_id: id, deleted: true });
    expect((await errorOf(h.pyro.getWorkspace(id))).code).toBe("workspace_not_found");
    expect(cli(["workspace", "list", "--json"], env).json()).toMatchObject({ count: 0 });
    const status = cli(["workspace", "status", "resumable", "--json"], env);
    expect(status.code).toBe(1);
    expect(status.json()).toMatchObject({ error: { code: "workspace_not_found" } });
    expect(await readdir(join(h.home, "workspaces"))).toEqual([]);
    expect(processAlive(pid)).toBe(false);
    expect(mountsMentioning(h.home)).toEqual([]);
  });
});
