import { execFileSync, spawn } from "node:child_process";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pyro as cli } from "../../helpers/cli.js";
import { bwrapSkipReason, type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";

/**
 * A start mounts the workspace's disk image with `mount -o loop`, which reuses a loop
 * device already backed by the same file (util-linux does, against double mounts). A disk
 * reader of the stopped workspace (disk-view.ts) has its own read-only one, which the
 * kernel detaches a moment after the reader exits: a start in that moment came up with a
 * read-only disk and failed ("source write-protected, mounted read-only", then the
 * overlay's "Invalid argument"), seen under load in the gVisor suite. Here the lingering
 * device is a reader's kind of mount held 700 ms: the start must wait for it and come up
 * writable (it failed so without the wait in linux/launch.ts).
 */
const skip = bwrapSkipReason();

describe.skipIf(skip !== "")(suiteTitle("a start after a disk reader's loop device", skip), () => {
  let h: Harness;
  beforeAll(async () => {
    h = await openHarness("disk-reuse");
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("waits for a read-only loop device on its image to go, and mounts its disk writable", async () => {
    const w = await h.create();
    await h.pyro.writeWorkspaceFile(w.workspace_id, "kept.txt", "kept\n");
    await h.pyro.stopWorkspace(w.workspace_id);
    const image = join(h.home, "workspaces", w.workspace_id, "sandbox", "disk.img");
    // A reader's kind of mount: read-only, autoclear, in a private namespace whose last
    // process exits 700 ms later (then the kernel detaches the device).
    const mnt = await h.tempDir("disk-reuse-mnt");
    const reader = spawn(
      "unshare",
      [
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t ext4 -o ro,loop,noload "$1" "$2" && echo up && sleep 0.7',
        "sh",
        image,
        mnt,
      ],
      { stdio: ["ignore", "pipe", "inherit"] },
    );
    await new Promise((resolve) => reader.stdout!.once("data", resolve));
    try {
      expect(execFileSync("losetup", ["-j", image], { encoding: "utf8" })).toContain("disk.img");
      // Through the CLI, as a user would: a process that starts it, one that runs a command.
      const started = cli(["workspace", "start", w.workspace_id, "--json"], h.cliEnv);
      expect(started.stderr).toBe("");
      expect(started.json()).toMatchObject({ state: "running" });
      const r = cli(
        [
          "workspace",
          "exec",
          w.workspace_id,
          "--json",
          "--",
          "cat kept.txt && echo more > more.txt && cat more.txt",
        ],
        h.cliEnv,
      );
      expect(r.json()).toMatchObject({ exit_code: 0, stdout: "kept\nmore\n", stderr: "" });
    } finally {
      reader.kill("SIGKILL");
      await new Promise((resolve) => reader.once("close", resolve));
    }
  });
});
