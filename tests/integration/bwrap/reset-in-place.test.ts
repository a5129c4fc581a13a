import { chownSync, statSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bwrapSkipReason, type Harness, openHarness, suiteTitle, writeTree } from "../../helpers/sandbox.js";

/**
 * A bwrap reset keeps the sandbox when it can (backends/bwrap/reset.ts): the same pid
 * namespace (its init's start time does not change) and the same agent, with every
 * other process ended, /workspace exactly the snapshot, and the IPC namespace emptied.
 * When the root layer or /dev changed since the start, it restarts instead. Each test
 * says which of the two it expects, and checks what the reset must discard either way.
 */
const skip = bwrapSkipReason();

describe.skipIf(skip !== "")(suiteTitle("bwrap reset in place", skip), () => {
  let h: Harness;
  let id: string;
  const sh = async (command: string) => {
    const r = await h.pyro.execWorkspace(id, command);
    expect(r.exit_code, `\`${command}\` failed: ${r.stderr}`).toBe(0);
    return r.stdout.trim();
  };
  /** The start time of the sandbox's pid 1: a new one after a restart. */
  const sandboxEpoch = () => sh("cut -d' ' -f22 /proc/1/stat");
  /** The pid (inside) of the agent: the process the runtime's loader started (its comm). */
  const agentPid = () =>
    sh("for p in /proc/[0-9]*; do case $(cat $p/comm 2>/dev/null) in ld-*) echo ${p#/proc/};; esac; done");

  beforeAll(async () => {
    h = await openHarness("reset-in-place");
    const seed = join(await h.tempDir("rip-seed"), "seed");
    await writeTree(seed, { "keep.txt": "keep\n", "edit.txt": "before\n" });
    id = (await h.create({ seedPath: seed })).workspace_id;
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("keeps the sandbox and its agent, ends every other process and restores /workspace", async () => {
    const epoch = await sandboxEpoch();
    const agent = await agentPid();
    await sh("echo after > edit.txt && rm keep.txt && mkdir -p new/dir && echo x > new/dir/f");
    // A detached process in its own session, and a service: both must end.
    await sh("setsid sh -c 'exec sleep 1000' </dev/null >/dev/null 2>&1 & echo started");
    await h.pyro.startService(id, "web", "sleep 1000");
    const before = Number(await sh("ls -d /proc/[0-9]* | wc -l"));

    const r = await h.pyro.resetWorkspace(id);
    expect(r.workspace_reset.snapshot_name).toBe("baseline");

    expect(await sandboxEpoch()).toBe(epoch);
    expect(await agentPid()).toBe(agent);
    expect(await sh("cat edit.txt keep.txt; ls")).toBe("before\nkeep\nedit.txt\nkeep.txt");
    const procs = await sh("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done");
    expect(procs).not.toContain("sleep 1000");
    expect(Number(await sh("ls -d /proc/[0-9]* | wc -l"))).toBeLessThan(before);
    expect((await h.pyro.listServices(id)).services).toEqual([]);
    // The new layer is mounted like the first: no set-uid, no devices.
    expect(await sh("awk '$5 == \"/workspace\" {print $6}' /proc/self/mountinfo | tail -1")).toMatch(
      /nosuid,nodev/,
    );
  });

  it("empties the System V IPC namespace, and commands work at once afterwards", async () => {
    const epoch = await sandboxEpoch();
    await sh("ipcmk -M 4096 >/dev/null && ipcmk -Q >/dev/null && ipcs -m | grep -c 0x");
    await h.pyro.resetWorkspace(id);
    expect(await sandboxEpoch()).toBe(epoch);
    expect(await sh("ipcs -m -q | grep -c 0x || true")).toBe("0");
    expect(await sh("echo ok > made.txt && cat made.txt")).toBe("ok");
  });

  it("resets onto a named snapshot in place", async () => {
    const epoch = await sandboxEpoch();
    await sh("echo snap > snap.txt");
    await h.pyro.createSnapshot(id, "s1");
    await sh("rm snap.txt edit.txt");
    await h.pyro.resetWorkspace(id, { snapshot: "s1" });
    expect(await sandboxEpoch()).toBe(epoch);
    expect(await sh("cat snap.txt edit.txt")).toBe("snap\nbefore");
  });

  it("stays in place when the host changes its own device nodes that bwrap binds into /dev", async () => {
    // gVisor's runsc chowns its stdio to nobody at every start: with /dev/null as its
    // stdio (a detached start), the host's /dev/null, which every bwrap sandbox's /dev
    // binds, gets a new ctime. The same no-op chown here: a host change, not the sandbox's.
    const epoch = await sandboxEpoch();
    const before = statSync("/dev/null", { bigint: true });
    chownSync("/dev/null", Number(before.uid), Number(before.gid));
    expect(statSync("/dev/null", { bigint: true }).ctimeNs).not.toBe(before.ctimeNs);
    await sh("echo x > gone.txt");
    await h.pyro.resetWorkspace(id);
    expect(await sandboxEpoch()).toBe(epoch);
    expect(await sh("ls gone.txt 2>/dev/null || echo gone")).toBe("gone");
  });

  it("restarts instead when the root layer changed, and the change is gone", async () => {
    const epoch = await sandboxEpoch();
    await sh("echo left > /tmp/left.txt && rm /tmp/left.txt && echo root > /etc/pyro-root.txt");
    await h.pyro.resetWorkspace(id);
    expect(await sandboxEpoch()).not.toBe(epoch);
    expect(await sh("cat /etc/pyro-root.txt 2>/dev/null || echo gone")).toBe("gone");
  });

  it("restarts instead when /dev changed (a file in /dev/shm), and the file is gone", async () => {
    const epoch = await sandboxEpoch();
    await sh("echo shm > /dev/shm/left");
    await h.pyro.resetWorkspace(id);
    expect(await sandboxEpoch()).not.toBe(epoch);
    expect(await sh("ls /dev/shm | wc -l")).toBe("0");
  });

  it("keeps a command from reading or tracing the agent (it outlives resets)", async () => {
    const agent = await agentPid();
    expect(agent).toMatch(/^\d+$/);
    expect(agent).not.toBe("1");
    for (const file of ["environ", "mem", "fd/0"]) {
      const r = await h.pyro.execWorkspace(id, `cat /proc/${agent}/${file} >/dev/null`);
      expect(r.exit_code, `/proc/${agent}/${file} was readable`).not.toBe(0);
      expect(r.stderr).toMatch(/Permission denied|Operation not permitted/);
    }
    // An ordinary command stays dumpable: its own /proc files are readable by its peers.
    expect(await sh("sleep 5 & p=$!; cat /proc/$p/environ >/dev/null && echo readable; kill $p")).toBe(
      "readable",
    );
  });
});
