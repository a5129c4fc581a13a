import { randomBytes } from "node:crypto";
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { removeTree } from "../../util/mounts.js";
import type { OneShotResult, OneShotSpec } from "../backend.js";
import { DEFAULT_DISK_MIB, diskTemplates, ensureDiskImage } from "../disk-image.js";
import { runGatedOneShot } from "../gated-run.js";
import { sandboxHostname } from "../guest.js";
import { detectCgroups, limitedCgroup } from "../linux/cgroups.js";
import { type LaunchTools, launchArgv } from "../linux/launch.js";
import { oneShotConfig } from "./oci.js";
import type { GvisorPlatform } from "./platform.js";
import { cgroupsPath, hostPidsMax, runArgv, sweepCgroups } from "./runsc.js";
import { preparePreloadFile, prepareStatxShim } from "./statx-shim.js";

/**
 * A one-shot command in a throwaway gVisor sandbox with the same isolation as a workspace
 * (copy-on-write root, user-space kernel, no network, no capabilities, limits), but no
 * agent: `/bin/sh -c COMMAND` is the container's process and its stdio are our pipes, so
 * `pyro run` costs one `runsc run`. The timeout kills the sandbox through its cgroup.
 */
export async function gvisorRunOnce(
  spec: OneShotSpec,
  rt: { bin: string; platform: GvisorPlatform; tools: LaunchTools },
): Promise<OneShotResult> {
  const id = `run_${randomBytes(6).toString("hex")}`;
  const dir = join(spec.scratchDir, id);
  // The writable layer lives in a disk image (disk-image.ts), mounted by the launch step.
  const disk = join(dir, "disk.img");
  const diskMount = join(dir, "disk");
  const upper = join(diskMount, "upper");
  const work = join(diskMount, "work");
  const merged = join(dir, "merged");
  const bundle = join(dir, "bundle");
  const root = join(dir, "runsc");
  // /workspace is the command's cwd: it must exist in the root, so it is made in the layer.
  for (const d of [diskMount, merged, bundle, root]) await mkdir(d, { recursive: true, mode: 0o700 });
  await ensureDiskImage(disk, spec.limits.disk_mib ?? DEFAULT_DISK_MIB, diskTemplates(spec)).catch(
    async (err: unknown) => {
      await removeTree(dir);
      throw err;
    },
  );
  const layout = await detectCgroups();
  const so = await prepareStatxShim(spec.runtimeCacheDir);
  const shim = so ? { so, preload: await preparePreloadFile(so) } : null;
  await writeFile(
    join(bundle, "config.json"),
    JSON.stringify(
      oneShotConfig({
        rootfs: merged,
        hostname: sandboxHostname(id),
        command: spec.command,
        env: spec.env,
        cgroupsPath: cgroupsPath(layout.base, id),
        limits: spec.limits,
        shim,
      }),
    ),
    { mode: 0o600 },
  );
  const cgroups = await limitedCgroup(layout, id, {
    ...spec.limits,
    pids_max: hostPidsMax(spec.limits.pids_max),
  }).catch(async (err: unknown) => {
    await removeTree(dir);
    throw err;
  });
  const argv = launchArgv(
    [{ lower: spec.rootfs, upper, work, target: merged }],
    dieWithOwner(runArgv({ bin: rt.bin, root }, rt.platform, bundle, id)),
    rt.tools,
    // /workspace is the command's cwd: it must exist in the root, so it is made in the layer.
    { disk: { image: disk, mount: diskMount, mkdirs: [join(upper, "workspace"), work] } },
  );
  try {
    return await runGatedOneShot(argv, {
      cgroups,
      what: "runsc",
      maxOutputBytes: spec.maxOutputBytes,
      ...(spec.onOutput ? { onOutput: spec.onOutput } : {}),
      ...(spec.stdin ? { stdin: spec.stdin } : {}),
      timeoutMs: spec.timeoutMs,
      ...(spec.signal ? { signal: spec.signal } : {}),
    });
  } finally {
    await cgroups.destroy().catch(() => {});
    await sweepCgroups(layout.root, layout.base, id).catch(() => []);
    await removeTree(dir);
  }
}

/**
 * `argv` (runsc) ended when the owner dies: the launch step execs it, so its parent is the
 * owner, and an owner killed mid-run takes runsc along (and runsc its sandbox and gofer),
 * as bwrap's --die-with-parent does for bwrap one-shots; the sweep
 * (linux/oneshot-sweep.ts) removes the rest. util-linux's setpriv, by path: busybox's
 * (which a busybox launch shell prefers) has no --pdeathsig.
 */
function dieWithOwner(argv: readonly string[]): string[] {
  return ["/usr/bin/setpriv", "--pdeathsig", "KILL", "--", ...argv];
}
