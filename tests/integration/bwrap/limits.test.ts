import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  allocatedBytes,
  bwrapSkipReason,
  ENV_CACHE,
  type Harness,
  openHarness,
  suiteTitle,
} from "../../helpers/sandbox.js";

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

  it("runs commands at nice 19, so the agent keeps a share of the CPU", async () => {
    // Set on the shell just after it starts: what it forks from then on inherits it.
    const r = await h.pyro.execWorkspace(id, "sleep 0.1; nice; sh -c nice");
    expect(r.stdout).toBe("19\n19\n");
  });

  it("ends a fork bomb with the call that started it, and the next call answers", async () => {
    const r = await h.pyro.execWorkspace(id, `bash -c '${BOMB}'`, { timeoutSeconds: 20 });
    expect(r.exit_code).toBe(0);
    if (Number.isFinite(baseline)) expect(await tasks()).toBeLessThanOrEqual(baseline + 2);
    const next = await h.pyro.execWorkspace(id, "echo alive", { timeoutSeconds: 20 });
    expect(next.stdout).toBe("alive\n");
  });

  it("kills a fork bomb still running at the timeout, and the next call answers", async () => {
    const r = await h.pyro.execWorkspace(id, `bash -c '${BOMB}; sleep 100' 2>/dev/null`, {
      timeoutSeconds: 5,
    });
    expect(r.timed_out).toBe(true);
    if (Number.isFinite(baseline)) expect(await tasks()).toBeLessThanOrEqual(baseline + 2);
    const next = await h.pyro.execWorkspace(id, "echo alive", { timeoutSeconds: 20 });
    expect(next.stdout).toBe("alive\n");
  });

  it("gives the writable layers a disk limit: ENOSPC inside, the host's space kept, the workspace usable", async () => {
    const small = (await h.create({ diskMib: 128 })).workspace_id;
    expect((await h.pyro.getWorkspace(small)).limits).toMatchObject({ disk_mib: 128 });
    // The workspace's own files on the host (its sparse disk image grows with what is
    // written); the file system's free space moves with every other test too.
    const used = () => allocatedBytes(join(h.home, "workspaces", small));
    const before = await used();
    const r = await h.pyro.execWorkspace(
      small,
      "dd if=/dev/zero of=/workspace/big bs=1M count=400; echo dd=$?",
    );
    expect(r.stderr).toMatch(/No space left on device/);
    expect(r.stdout).toContain("dd=1");
    // The image grew by at most its size; nothing else of the host's disk went.
    expect((await used()) - before).toBeLessThan(160 * 1024 * 1024);
    const after = await h.pyro.execWorkspace(
      small,
      "rm /workspace/big && echo fine > /workspace/ok.txt && cat /workspace/ok.txt",
    );
    expect(after.stdout).toBe("fine\n");
  });

  it("gives one-shots the same disk limit", async () => {
    const r = await h.pyro.run("debian:12", "dd if=/dev/zero of=/tmp/big bs=1M count=400; echo dd=$?", {
      backend: "bwrap",
      diskMib: 128,
    });
    expect(r.stderr).toMatch(/No space left on device/);
    expect(r.stdout).toContain("dd=1");
  });

  it("refuses a disk limit it cannot give, before anything is made", async () => {
    const before = (await h.pyro.listWorkspaces()).count;
    await expect(h.create({ diskMib: 10 })).rejects.toMatchObject({ code: "invalid_argument" });
    expect((await h.pyro.listWorkspaces()).count).toBe(before);
  });

  it("recovers a wedged workspace through stop and start, with its files", async () => {
    const w = (await h.create()).workspace_id;
    await h.pyro.writeWorkspaceFile(w, "keep.txt", "kept\n");
    await h.pyro.execWorkspace(w, "echo root-layer > /root/note.txt");
    // Workspace code freezes its own agent: the next call cannot be answered.
    // (setsid: a plain background job would be hung up when the call returns.)
    const freeze =
      "import os, time\n" +
      "time.sleep(0.2)\n" +
      "for p in filter(str.isdigit, os.listdir('/proc')):\n" +
      "  argv = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')\n" +
      "  if argv[0].startswith(b'/run/pyro/runtime/lib/ld-') and any(a.endswith(b'bundle/main.js') for a in argv): os.kill(int(p), 19)\n";
    await h.pyro.writeWorkspaceFile(w, "freeze.py", freeze);
    await h.pyro.execWorkspace(w, "setsid python3 freeze.py >/dev/null 2>&1 &");
    await new Promise((r) => setTimeout(r, 500));
    const { Pyro } = await import("../../../src/sdk/pyro.js");
    const fresh = new Pyro({ home: h.home, environmentsDir: ENV_CACHE });
    try {
      await expect(fresh.execWorkspace(w, "true")).rejects.toMatchObject({ code: "timeout" });
      expect((await fresh.stopWorkspace(w)).state).toBe("stopped");
      expect((await fresh.startWorkspace(w)).state).toBe("running");
      const r = await fresh.execWorkspace(w, "cat keep.txt /root/note.txt");
      expect(r.stdout).toBe("kept\nroot-layer\n");
    } finally {
      await fresh.close();
    }
  });

  it("keeps the agent when the workspace hits its memory limit: the OOM killer takes commands first", async () => {
    const w = (await h.create({ memoryMib: 256 })).workspace_id;
    const agentPid = async () =>
      (
        await h.pyro.execWorkspace(
          w,
          "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q '^/run/pyro/runtime/lib/ld-' && echo ${p#/proc/}; done",
        )
      ).stdout.trim();
    const before = await agentPid();
    expect(before).toMatch(/^\d+$/);
    // Set on the shell just after it starts, like the nice value.
    expect((await h.pyro.execWorkspace(w, "sleep 0.1; cat /proc/self/oom_score_adj")).stdout).toBe("500\n");
    // Thirty small allocators, each far smaller than the agent, together over the limit.
    const hog =
      "import time\nx = bytearray(12 * 1024 * 1024)\nfor i in range(0, len(x), 4096): x[i] = 1\ntime.sleep(5)\n";
    await h.pyro.writeWorkspaceFile(w, "hog.py", hog);
    const r = await h.pyro.execWorkspace(w, "for i in $(seq 30); do python3 hog.py & done; wait; echo done");
    expect(r.stdout).toContain("done");
    expect(await agentPid()).toBe(before);
  });
});

describe.skipIf(skip !== "")(suiteTitle("concurrent starts on bwrap", skip), () => {
  let h: Harness;
  beforeAll(async () => {
    h = await openHarness("concurrent");
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  // Each start loop-mounts its disk image. With busybox's mount, launches racing for the
  // same free loop device spun at full CPU (four of eight stuck until their 20 s timeout,
  // or "can't setup loop device"); util-linux's mount sets them up one by one.
  it("starts eight workspaces at once, each with its own disk image", { timeout: 240_000 }, async () => {
    const made = await Promise.all(Array.from({ length: 8 }, () => h.create()));
    const answers = await Promise.all(
      made.map((w) => h.pyro.execWorkspace(w.workspace_id, "df -P /workspace | tail -1")),
    );
    for (const r of answers) expect(r.exit_code, r.stderr).toBe(0);
    await Promise.all(made.map((w) => h.pyro.deleteWorkspace(w.workspace_id)));
  });
});
