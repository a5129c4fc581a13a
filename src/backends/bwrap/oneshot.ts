import { randomBytes } from "node:crypto";
import { closeSync, openSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import { PyroError } from "../../errors.js";
import { removeTree } from "../../util/mounts.js";
import type { OneShotResult, OneShotSpec } from "../backend.js";
import { DEFAULT_DISK_MIB, diskTemplates, ensureDiskImage } from "../disk-image.js";
import { runGatedOneShot } from "../gated-run.js";
import { sandboxHostname } from "../guest.js";
import { detectCgroups, limitedCgroup } from "../linux/cgroups.js";
import { type LaunchTools, launchArgv } from "../linux/launch.js";
import { isolationArgs } from "./isolation.js";
import { writeSeccompFile } from "./seccomp.js";

/**
 * A one-shot command in a throwaway bwrap sandbox with the same isolation as a workspace
 * (copy-on-write root, namespaces, no capabilities, seccomp, cgroup limits), but no
 * guest agent: the command is bwrap's child, so `pyro run` costs one sandbox spawn.
 */
export async function bwrapRunOnce(spec: OneShotSpec, tools: LaunchTools): Promise<OneShotResult> {
  if (process.getuid?.() !== 0) {
    throw new PyroError(
      "backend_unavailable",
      "the bwrap backend needs root here (overlay mounts and cgroups)",
    );
  }
  const id = `run_${randomBytes(6).toString("hex")}`;
  const dir = join(spec.scratchDir, id);
  // The writable layer lives in a disk image (disk-image.ts), mounted by the launch step.
  const disk = join(dir, "disk.img");
  const diskMount = join(dir, "disk");
  const upper = join(diskMount, "upper");
  const work = join(diskMount, "work");
  const merged = join(dir, "merged");
  await Promise.all([diskMount, merged].map((d) => mkdir(d, { recursive: true, mode: 0o700 })));
  await ensureDiskImage(disk, spec.limits.disk_mib ?? DEFAULT_DISK_MIB, diskTemplates(spec)).catch(
    async (err: unknown) => {
      await removeTree(dir);
      throw err;
    },
  );
  const seccomp = join(dir, "seccomp.bpf");
  await writeSeccompFile(seccomp);
  const cgroups = await limitedCgroup(await detectCgroups(), id, spec.limits).catch(async (err: unknown) => {
    await removeTree(dir);
    throw err;
  });
  const bwrap = [
    "bwrap",
    "--bind",
    merged,
    "/",
    ...isolationArgs(sandboxHostname(id), spec.env),
    "--dir",
    "/workspace",
    "--chdir",
    "/workspace",
    "--",
    "/bin/sh",
    "-c",
    spec.command,
  ];
  const argv = launchArgv([{ lower: spec.rootfs, upper, work, target: merged }], bwrap, tools, {
    disk: { image: disk, mount: diskMount, mkdirs: [upper, work] },
  });
  const fd = openSync(seccomp, "r");
  try {
    return await runGatedOneShot(argv, {
      cgroups,
      what: "bwrap",
      maxOutputBytes: spec.maxOutputBytes,
      ...(spec.onOutput ? { onOutput: spec.onOutput } : {}),
      ...(spec.stdin ? { stdin: spec.stdin } : {}),
      timeoutMs: spec.timeoutMs,
      extraFds: [fd],
      ...(spec.signal ? { signal: spec.signal } : {}),
    });
  } finally {
    closeSync(fd);
    await cgroups.destroy().catch(() => {});
    await removeTree(dir);
  }
}
