import { randomBytes } from "node:crypto";
import { closeSync, openSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import { PyroError } from "../../errors.js";
import { removeTree } from "../../util/mounts.js";
import type { OneShotResult, OneShotSpec } from "../backend.js";
import { claimDiskImage, DEFAULT_DISK_MIB, diskTemplates, type SpareRefill } from "../disk-image.js";
import { runGatedOneShot } from "../gated-run.js";
import { hostCgroups, limitedCgroup } from "../linux/cgroups.js";
import { type LaunchTools, launchArgv } from "../linux/launch.js";
import { cleanUpDetached } from "../linux/oneshot-cleaner.js";
import { bwrapPrefix, seccompFile } from "./oneshot-argv.js";
import { PreparedRun } from "./prepared-run.js";

/**
 * A one-shot command in a throwaway bwrap sandbox with the same isolation as a workspace
 * (copy-on-write root, namespaces, no capabilities, seccomp, cgroup limits), but no
 * guest agent: the command is bwrap's child, so `pyro run` costs one sandbox spawn.
 * With a keeper (the engine's pool is on) the run takes a launch prepared after the
 * previous run (prepared-run.ts) and prepares the next one once it is done.
 */
export async function bwrapRunOnce(spec: OneShotSpec, tools: LaunchTools): Promise<OneShotResult> {
  if (process.getuid?.() !== 0) {
    throw new PyroError(
      "backend_unavailable",
      "the bwrap backend needs root here (overlay mounts and cgroups)",
    );
  }
  // argv and the prepared launch's argument list cannot carry a NUL: refused, not split.
  for (const v of [spec.command, ...Object.entries(spec.env).flat()])
    if (v.includes("\0"))
      throw new PyroError("invalid_argument", "the command and environment values cannot contain NUL bytes");
  const keep = spec.keep;
  if (!keep) return coldRun(spec, tools);
  const key = ["bwrap", spec.rootfs, spec.limits.disk_mib ?? DEFAULT_DISK_MIB, spec.scratchDir].join("\0");
  try {
    const prepared = await keep.take<PreparedRun>(key);
    if (prepared) {
      const r = await prepared.run(spec).finally(() => keep.track(prepared.close()));
      if (r) return r;
    }
    return await coldRun(spec, tools);
  } finally {
    // After the run, not against it for the CPU.
    keep.prepare(key, () => PreparedRun.start(spec, tools));
  }
}

/** The run without a prepared launch: every step of the sandbox's start on its path. */
async function coldRun(spec: OneShotSpec, tools: LaunchTools): Promise<OneShotResult> {
  const id = `run_${randomBytes(6).toString("hex")}`;
  const dir = join(spec.scratchDir, id);
  // The writable layer lives in a disk image (disk-image.ts), mounted by the launch step.
  const disk = join(dir, "disk.img");
  const diskMount = join(dir, "disk");
  const upper = join(diskMount, "upper");
  const work = join(diskMount, "work");
  const merged = join(dir, "merged");
  let nextSpare: SpareRefill | undefined;
  // The disk, the seccomp file and the cgroup at once; any failure undoes all of them.
  const [files, made] = await Promise.allSettled([
    (async () => {
      await Promise.all([diskMount, merged].map((d) => mkdir(d, { recursive: true, mode: 0o700 })));
      const { refill, deferred } = await claimDiskImage(
        disk,
        spec.limits.disk_mib ?? DEFAULT_DISK_MIB,
        diskTemplates(spec),
        // A CLI's run leaves the copy of the next spare to its cleaner: not against its start.
        { deferRefill: spec.detachCleanup === true },
      );
      // The next spare is copied while this run goes on; an owner waits for it in ready().
      spec.keep?.track(refill);
      nextSpare = deferred;
      return seccompFile(spec.runtimeCacheDir);
    })(),
    hostCgroups().then((layout) => limitedCgroup(layout, id, spec.limits)),
  ]);
  if (files.status === "rejected" || made.status === "rejected") {
    if (made.status === "fulfilled") await made.value.destroy().catch(() => {});
    await removeTree(dir);
    throw files.status === "rejected" ? files.reason : (made as PromiseRejectedResult).reason;
  }
  const seccomp = files.value;
  const cgroups = made.value;
  const bwrap = [...bwrapPrefix(merged, id, spec.env), "--", "/bin/sh", "-c", spec.command];
  const argv = launchArgv([{ lower: spec.rootfs, upper, work, target: merged }], bwrap, tools, {
    disk: { image: disk, mount: diskMount, mkdirs: [upper, work], throwaway: true },
    readOnlyHost: true,
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
    // A CLI's run answers first: the cleaner kills what is left now, removes the rest later.
    const handedOff =
      spec.detachCleanup === true &&
      cleanUpDetached({
        dir,
        cgroupDirs: [...cgroups.dirs.values()],
        shell: tools.shell,
        ...(nextSpare ? { refill: nextSpare } : {}),
      });
    if (!handedOff) {
      await cgroups.destroy().catch(() => {});
      await removeTree(dir);
    }
  }
}
