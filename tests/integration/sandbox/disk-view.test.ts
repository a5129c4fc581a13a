import { spawnSync } from "node:child_process";
import { mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DISK_VIEW_SCRIPT, HOST_IMAGE_OPTIONS } from "../../../src/backends/bwrap/disk-view.js";
import { isRoot } from "../../helpers/cli.js";
import { onPath } from "../../helpers/sandbox.js";

/**
 * The stopped-workspace disk reader's mount script against guest-written images (a VM's
 * state disk is written by the guest): a symlink anywhere in the writable layer's path
 * must not lead the host-side script (whose / is the host's) to a host directory.
 */
const skip = !isRoot
  ? "needs root (loop mounts in a private mount namespace)"
  : !onPath("mkfs.ext4") || !onPath("unshare")
    ? "needs mkfs.ext4 and unshare (npm run setup)"
    : "";

describe.skipIf(skip !== "")(`disk view of a guest-written image${skip ? ` (skipped: ${skip})` : ""}`, () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "pyro-diskview-"));
    await mkdir(join(dir, "lower"));
    await writeFile(join(dir, "lower", "base.txt"), "from the snapshot\n");
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  /** An ext4 image made from a tree `build` fills; the script's view of it, reading `file`. */
  async function view(name: string, build: (root: string) => Promise<void>, file: string) {
    const tree = join(dir, `${name}-tree`);
    await mkdir(tree);
    await build(tree);
    const image = join(dir, `${name}.img`);
    const mk = spawnSync("mkfs.ext4", ["-q", "-F", "-d", tree, image, "16M"], { encoding: "utf8" });
    expect(mk.status, mk.stderr).toBe(0);
    const mnt = join(dir, `${name}-mnt`);
    await mkdir(mnt);
    return spawnSync(
      "unshare",
      [
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        DISK_VIEW_SCRIPT,
        "pyro-disk",
        mnt,
        image,
        HOST_IMAGE_OPTIONS,
        "ws/upper",
        join(dir, "lower"),
        "--",
        "/bin/cat",
        join(mnt, "ws", file),
      ],
      { encoding: "utf8" },
    );
  }

  it("shows the writable layer over the snapshot", async () => {
    const r = await view(
      "good",
      async (t) => {
        await mkdir(join(t, "ws", "upper"), { recursive: true });
        await writeFile(join(t, "ws", "upper", "new.txt"), "written in the workspace\n");
      },
      "new.txt",
    );
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toBe("written in the workspace\n");
  });

  it("refuses an upper layer that is a symlink to a host directory", async () => {
    const r = await view(
      "upper-link",
      async (t) => {
        await mkdir(join(t, "ws"));
        await symlink("/etc", join(t, "ws", "upper"));
      },
      "passwd",
    );
    expect(r.status).not.toBe(0);
    expect(r.stdout).not.toContain("root:");
    expect(r.stderr).toContain("symlink");
  });

  it("refuses a symlink higher in the upper layer's path", async () => {
    const r = await view(
      "ws-link",
      async (t) => {
        await mkdir(join(t, "decoy", "upper"), { recursive: true });
        await symlink("/etc/../etc", join(t, "ws"));
      },
      "passwd",
    );
    expect(r.status).not.toBe(0);
    expect(r.stdout).not.toContain("root:");
  });
});
