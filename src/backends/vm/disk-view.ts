import { randomBytes } from "node:crypto";
import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { PyroError } from "../../errors.js";
import { exists } from "../../util/fs.js";
import { firstLine, run, which } from "../../util/run.js";
import type { SandboxSpec } from "../backend.js";
import type { DiskView } from "../bwrap/disk-view.js";
import { sweepStale } from "../disk-reader.js";
import { toolSandboxArgs, withReadOnlyHost } from "../linux/tool-sandbox.js";

/**
 * The view of a stopped microVM workspace (qemu, firecracker) for the disk reader
 * (bwrap/disk-view.ts). Its /workspace is, inside the guest, an overlay of the seed disk
 * (the snapshot tree, which the host has) under `ws/upper` on the state disk (ext4, see
 * initramfs.ts and agent/guest/ops/vm.ts). The state disk was written by the guest's
 * kernel, which the workspace's code controls: it is hostile bytes. So it is never
 * mounted as it is: it is copied to a private raw image (`qemu-img convert`, sparse; a
 * fresh state disk is a few MB), checked and repaired by `e2fsck -fy` in a bwrap sandbox
 * that sees only that copy (a userspace parser first; it also replays the journal of a
 * VM that was stopped without unmounting), and only then loop-mounted read-only by the
 * reader. The copy goes when the reader ends; copies of readers that died are swept at
 * the next open.
 */

/** Prefix of a reader's scratch directory in the workspace's sandbox directory: `<prefix><pid>-<random>`. */
const SCRATCH_PREFIX = ".disk-view-";

/**
 * Mount options of the checked copy: read-only, journal already replayed by e2fsck; the
 * guest wrote it, so no symlink on it is followed by the host-side mount script.
 */
const COPY_OPTIONS = "ro,loop,noload,nosuid,nodev,noexec,nosymfollow";

export async function vmDiskView(
  spec: SandboxSpec,
  stateDisk: { path: string; format: "qcow2" | "raw" },
): Promise<DiskView> {
  const lower = join(spec.snapshotsDir, spec.snapshot);
  // No state disk: fresh (never started, or its changes discarded): the snapshot as it is.
  if (!(await exists(stateDisk.path))) return { upper: null, lower };
  await sweepStale(spec.dir, SCRATCH_PREFIX);
  const scratch = join(spec.dir, `${SCRATCH_PREFIX}${process.pid}-${randomBytes(4).toString("hex")}`);
  await mkdir(scratch, { mode: 0o700 });
  try {
    const raw = join(scratch, "state.raw");
    const convert = await run(
      ["qemu-img", "convert", "-f", stateDisk.format, "-O", "raw", stateDisk.path, raw],
      { timeoutMs: 10 * 60_000 },
    );
    if (convert.exitCode !== 0)
      throw new PyroError(
        "backend_unavailable",
        `cannot copy the state disk of ${spec.workspace_id}: ${firstLine(convert.stderr) || `exit ${convert.exitCode}`}`,
        convert.spawnError ? "install the Debian package qemu-utils" : undefined,
      );
    await checkCopy(scratch, spec.workspace_id);
    return { image: { path: raw, options: COPY_OPTIONS }, upper: "ws/upper", lower, scratch };
  } catch (err) {
    await rm(scratch, { recursive: true, force: true });
    throw err;
  }
}

/**
 * `e2fsck -fy` of the copy in a bwrap sandbox: no network, no capabilities, the host's
 * programs read-only and only the scratch directory writable. Exit codes 0-2 mean clean
 * or repaired; anything else means a filesystem the reader will not mount.
 */
async function checkCopy(scratch: string, id: string): Promise<void> {
  const bwrap = await which("bwrap");
  if (!bwrap)
    throw new PyroError(
      "backend_unavailable",
      "reading a stopped VM workspace's disk needs bubblewrap",
      "install the Debian package bubblewrap",
    );
  const r = await run(
    withReadOnlyHost([
      bwrap,
      ...toolSandboxArgs({ etc: true }),
      "--proc",
      "/proc",
      "--dev",
      "/dev",
      "--bind",
      scratch,
      "/scratch",
      "--",
      "e2fsck",
      "-fy",
      "/scratch/state.raw",
    ]),
    { timeoutMs: 10 * 60_000 },
  );
  if (r.exitCode === null || r.exitCode > 2)
    throw new PyroError(
      "backend_unavailable",
      `the state disk of ${id} is damaged beyond repair (e2fsck exit ${r.exitCode ?? r.signal}: ${firstLine(r.stdout) || firstLine(r.stderr)})`,
      "start the workspace to read it from inside, or reset it",
    );
}
