import { randomBytes } from "node:crypto";
import { closeSync, constants, openSync, readFileSync, readSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  bwrapSkipReason,
  type Harness,
  hostProcesses,
  openHarness,
  processAlive,
  sandboxPid,
  suiteTitle,
  waitUntil,
} from "../../helpers/sandbox.js";

/**
 * The swap helper of bwrap's in-place reset (backends/bwrap/reset-helper.ts): a root
 * shell beside each sandbox that mounts /workspace's new layer when the host asks
 * through a FIFO. It must do the resets, refuse anything but its two operations on a
 * valid snapshot name or pool hostname, stay out of the sandbox's reach, and end with the sandbox.
 */
const skip = bwrapSkipReason();

describe.skipIf(skip !== "")(suiteTitle("bwrap reset helper", skip), () => {
  let h: Harness;
  let id: string;
  const sh = async (command: string) => {
    const r = await h.pyro.execWorkspace(id, command);
    expect(r.exit_code, `\`${command}\` failed: ${r.stderr}`).toBe(0);
    return r.stdout.trim();
  };
  /** The helper's watcher processes (pyro-reset-watch) for the workspace's launch step. */
  const watchers = (launch: number) =>
    hostProcesses((argv) => argv.includes("pyro-reset-watch") && argv.at(-1) === String(launch));
  /**
   * The helper of the workspace's sandbox: its pid and sandbox directory (from its argv).
   * A helper just starting forks children that show its argv for a moment (busybox runs
   * applets like mkfifo in a forked child without exec; the watcher before its exec), and
   * is one process before its first fork too: it has settled once its watcher runs (it
   * forks nothing more until a request), so wait for both, and judge that same look.
   */
  const helper = async () => {
    const launch = sandboxPid(h.pyro, id)!;
    const find = () =>
      hostProcesses((argv) => argv.includes("pyro-reset-helper") && argv.includes(String(launch)));
    let found = find();
    await waitUntil(() => {
      found = find();
      return found.length === 1 && watchers(launch).length === 1;
    }, 5_000);
    expect(found, `one helper per sandbox: ${JSON.stringify(found)}`).toHaveLength(1);
    const argv = found[0]!.argv;
    return { pid: found[0]!.pid, dir: argv[argv.indexOf("pyro-reset-helper") + 2]! };
  };
  const epoch = () => sh("cut -d' ' -f22 /proc/1/stat");
  /**
   * One request line written to the helper's FIFO (in parts, each `gapMs` after the one
   * before), and the answer (null: none within 3 s).
   */
  const askRaw = async (dir: string, parts: string[], gapMs = 0): Promise<string | null> => {
    const fifo = join(dir, "reset-helper");
    const req = openSync(join(fifo, "req"), constants.O_WRONLY | constants.O_NONBLOCK);
    try {
      for (const [i, part] of parts.entries()) {
        if (i > 0) await new Promise((r) => setTimeout(r, gapMs));
        writeFileSync(req, part);
      }
    } finally {
      closeSync(req);
    }
    const rep = openSync(join(fifo, "rep"), constants.O_RDONLY | constants.O_NONBLOCK);
    const buf = Buffer.alloc(4096);
    let got = "";
    try {
      await waitUntil(() => {
        try {
          got += buf.toString("utf8", 0, readSync(rep, buf));
        } catch {} // EAGAIN: nothing yet
        return got.includes("\n");
      }, 3_000);
    } finally {
      closeSync(rep);
    }
    return got.includes("\n") ? got.trim() : null;
  };
  /** A request under a new ID as the host makes them (16 hex digits): the answer's word. */
  const ask = async (dir: string, request: string): Promise<string | null> => {
    const rid = randomBytes(8).toString("hex");
    const got = await askRaw(dir, [`${rid} ${request}\n`]);
    return got?.startsWith(`${rid} `) ? got.slice(rid.length + 1) : got;
  };

  beforeAll(async () => {
    h = await openHarness("reset-helper");
    id = (await h.create({})).workspace_id;
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("does the in-place reset's mount (the new layer is mounted by it, not by a spawn)", async () => {
    const { pid, dir } = await helper();
    const before = await epoch();
    await sh("echo x > gone.txt");
    await h.pyro.resetWorkspace(id);
    expect(await epoch()).toBe(before);
    expect(await sh("ls")).toBe("");
    // Only the helper names the lower layer through its descriptor 5.
    const mounts = readFileSync(`/proc/${pid}/mountinfo`, "utf8").split("\n");
    const ws = mounts.filter((l) => l.split(" ")[4] === join(dir, "mnt", "ws"));
    expect(ws.at(-1)).toContain("lowerdir=/proc/self/fd/5/baseline");
    // Each later reset unmounts the overlay the one before stacked (in the background,
    // the helper goes on once it is detached): the first overlay and the newest, no more.
    for (const name of ["a", "b", "c"]) {
      await sh(`echo ${name} > ${name}.txt`);
      await h.pyro.resetWorkspace(id);
      expect(await sh("ls")).toBe("");
    }
    const after = readFileSync(`/proc/${pid}/mountinfo`, "utf8").split("\n");
    expect(after.filter((l) => l.split(" ")[4] === join(dir, "mnt", "ws"))).toHaveLength(2);
    expect(await epoch()).toBe(before);
  });

  it("is out of the sandbox's reach: no process, no FIFO, no host path inside", async () => {
    const { pid, dir } = await helper();
    const inside = await sh(
      `for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done; ` +
        `find / -xdev -type p 2>/dev/null; ls -d ${dir} 2>&1 || true`,
    );
    expect(inside).not.toContain("pyro-reset-helper");
    expect(inside).not.toContain("reset-helper/req");
    expect(inside).toContain("No such file or directory");
    // The host sees it in the host's pid namespace only (one NSpid entry).
    expect(readFileSync(`/proc/${pid}/status`, "utf8")).toMatch(/^NSpid:\s+\d+$/m);
  });

  it("refuses every request but a swap onto a valid snapshot name, and changes nothing", async () => {
    const { pid, dir } = await helper();
    const stacked = () =>
      readFileSync(`/proc/${pid}/mountinfo`, "utf8")
        .split("\n")
        .filter((l) => l.split(" ")[4] === join(dir, "mnt", "ws")).length;
    const n = stacked();
    for (const bad of [
      "swap ../../etc 0 0",
      "swap a/b 0 0",
      "swap .hidden 0 0",
      "swap baseline 2 0",
      "swap baseline 0 0 extra",
      "umount baseline 1 0",
      "sh -c id",
      "swap baseline 01",
      "swap baseline 0:: 0",
      "swap ba:se 0 0",
      "swap",
    ]) {
      expect(await ask(dir, bad), bad).toBe("refused");
    }
    // A request without an ID of exactly 16 hex digits gets no answer at all (the tail
    // of a cut line is never taken for a request): the answer after them is the first.
    const ids = ["x-y", "a1", "0123456789abcde", "0123456789abcdef0", "0123456789ABCDEF"];
    const rid = randomBytes(8).toString("hex");
    const lines = [...ids.map((i) => `${i} swap baseline 0 0\n`), `${rid} swap ../x 0 0\n`];
    expect(await askRaw(dir, lines)).toBe(`${rid} refused`);
    expect(stacked()).toBe(n);
    expect(await sh("echo ok > f && cat f && rm f")).toBe("ok");
  });

  it("sets the sandbox's hostname only to a pool's name (pyro- and 1-12 of [A-Za-z0-9-])", async () => {
    const { dir } = await helper();
    const before = await sh("hostname");
    for (const bad of [
      "hostname evil 0 0",
      "hostname pyro- 0 0",
      "hostname pyro-abcdefghijklm 0 0",
      "hostname pyro-a_b 0 0",
      "hostname pyro-$(id) 0 0",
      "hostname pyro-a 1 0",
      "hostname pyro-a 0 0 extra",
      "hostname -F/etc/passwd 0 0",
    ]) {
      expect(await ask(dir, bad), bad).toBe("refused");
    }
    expect(await sh("hostname")).toBe(before);
    expect(await ask(dir, "hostname pyro-abc-123 0 0")).toBe("ok");
    expect(await sh("hostname")).toBe("pyro-abc-123");
    expect(await ask(dir, `hostname ${before} 0 0`)).toBe("ok");
    expect(await sh("hostname")).toBe(before);
  });

  it("takes a request line that arrives in parts, seconds apart, as the one request it is", async () => {
    // A busy machine can stop the helper in the middle of a line; a read with a deadline
    // (the helper's old once-a-second wake-up) then lost the part read so far.
    const { dir } = await helper();
    const before = await sh("hostname");
    const rid = randomBytes(8).toString("hex");
    const parts = [`${rid.slice(0, 8)}`, `${rid.slice(8)} hostname pyro-`, "parts 0 0\n"];
    expect(await askRaw(dir, parts, 1_300)).toBe(`${rid} ok`);
    expect(await sh("hostname")).toBe("pyro-parts");
    expect(await ask(dir, `hostname ${before} 0 0`)).toBe("ok");
  });

  it("without its helper the reset still happens in place (through a spawned nsenter)", async () => {
    const { pid } = await helper();
    process.kill(pid, "SIGKILL");
    expect(await waitUntil(() => !processAlive(pid), 5_000)).toBe(true);
    const before = await epoch();
    await sh("echo x > gone.txt");
    await h.pyro.resetWorkspace(id);
    expect(await epoch()).toBe(before);
    expect(await sh("ls")).toBe("");
  });

  it("leaves by itself once the launch step is gone (no stop through the cgroup)", async () => {
    // A new sandbox (the previous test killed this one's helper) and so a new helper.
    await h.pyro.stopWorkspace(id);
    await h.pyro.startWorkspace(id);
    const { pid } = await helper();
    const launch = sandboxPid(h.pyro, id)!;
    expect(watchers(launch)).toHaveLength(1);
    process.kill(launch, "SIGKILL");
    // Its watcher looks once a second whether the launch step is still in its mount
    // namespace, and wakes it; both leave.
    expect(await waitUntil(() => !processAlive(pid), 5_000)).toBe(true);
    expect(await waitUntil(() => watchers(launch).length === 0, 5_000)).toBe(true);
    // The workspace's next use starts a new sandbox, and with it a new helper.
    await h.pyro.stopWorkspace(id).catch(() => {});
    await h.pyro.startWorkspace(id);
    expect((await helper()).pid).not.toBe(pid);
  });

  it("ends with the sandbox", async () => {
    const { pid, dir } = await helper();
    const launch = sandboxPid(h.pyro, id)!;
    expect(watchers(launch)).toHaveLength(1);
    await h.pyro.stopWorkspace(id);
    expect(processAlive(pid)).toBe(false);
    expect(watchers(launch)).toEqual([]);
    // No reader: the FIFO cannot be written any more.
    expect(() =>
      openSync(join(dir, "reset-helper", "req"), constants.O_WRONLY | constants.O_NONBLOCK),
    ).toThrow(/ENXIO/);
  });
});
