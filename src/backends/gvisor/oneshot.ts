import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { PyroError } from "../../core/errors.js";
import { removeTree } from "../../util/mounts.js";
import type { OneShotResult, OneShotSpec } from "../backend.js";
import { CgroupLimits, detectCgroups } from "../bwrap/cgroups.js";
import { type LaunchTools, launchArgv } from "../bwrap/launch.js";
import { Capture, signalNumber } from "../bwrap/oneshot.js";
import { oneShotConfig } from "./oci.js";
import { installPreload, prepareStatxShim } from "./statx-shim.js";
import type { GvisorPlatform } from "./platform.js";
import { cgroupsPath, hostPidsMax, runArgv, sweepCgroups } from "./runsc.js";

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
  const upper = join(dir, "upper");
  const work = join(dir, "work");
  const merged = join(dir, "merged");
  const bundle = join(dir, "bundle");
  const root = join(dir, "runsc");
  // /workspace is the command's cwd: it must exist in the root, so it is made in the layer.
  for (const d of [join(upper, "workspace"), work, merged, bundle, root])
    await mkdir(d, { recursive: true, mode: 0o700 });
  const layout = await detectCgroups();
  const shim = await prepareStatxShim(spec.runtimeCacheDir);
  if (shim) await installPreload(upper);
  await writeFile(
    join(bundle, "config.json"),
    JSON.stringify(
      oneShotConfig({
        rootfs: merged,
        hostname: `pyro-${id.slice(4)}`,
        command: spec.command,
        env: spec.env,
        cgroupsPath: cgroupsPath(layout.base, id),
        limits: spec.limits,
        shim,
      }),
    ),
    { mode: 0o600 },
  );
  const cgroups = await CgroupLimits.create(layout, id, {
    vcpus: spec.limits.vcpus,
    memoryMib: spec.limits.memory_mib,
    pidsMax: hostPidsMax(spec.limits.pids_max),
  }).catch(async (err: Error) => {
    await removeTree(dir);
    throw new PyroError(
      "backend_unavailable",
      `cannot apply resource limits: ${err.message}`,
      "pyro refuses to run without limits",
    );
  });
  const argv = launchArgv(
    [{ lower: spec.rootfs, upper, work, target: merged }],
    runArgv({ bin: rt.bin, root }, rt.platform, bundle, id),
    rt.tools,
  );
  const started = performance.now();
  try {
    return await new Promise<OneShotResult>((resolve, reject) => {
      const child = spawn(argv[0]!, argv.slice(1), { stdio: ["pipe", "pipe", "pipe"] });
      const out = new Capture(spec.maxOutputBytes);
      const err = new Capture(spec.maxOutputBytes);
      child.stdout!.on("data", (c: Buffer) => out.push(c));
      child.stderr!.on("data", (c: Buffer) => err.push(c));
      let timedOut = false;
      // The guest's processes live inside the sentry: killing the cgroup kills them all.
      const killAll = () => {
        cgroups.destroy().catch(() => child.kill("SIGKILL"));
      };
      const timer = setTimeout(() => {
        timedOut = true;
        killAll();
      }, spec.timeoutMs);
      const onAbort = () => killAll();
      spec.signal?.addEventListener("abort", onAbort, { once: true });
      child.on("error", (e) => {
        clearTimeout(timer);
        reject(new PyroError("backend_unavailable", `cannot start runsc: ${e.message}`));
      });
      child.on("close", (code, signal) => {
        clearTimeout(timer);
        spec.signal?.removeEventListener("abort", onAbort);
        resolve({
          exit_code: timedOut ? 124 : (code ?? 128 + signalNumber(signal)),
          stdout: out.text(),
          stderr: err.text(),
          duration_ms: Math.round(performance.now() - started),
          timed_out: timedOut,
          truncated: out.truncated || err.truncated,
        });
      });
      cgroups
        .addProcess(child.pid!)
        .then(() => child.stdin!.end("go\n"))
        .catch((e: Error) => {
          child.kill("SIGKILL");
          reject(
            new PyroError("backend_unavailable", `cannot place the sandbox in its cgroup: ${e.message}`),
          );
        });
    });
  } finally {
    await cgroups.destroy().catch(() => {});
    await sweepCgroups(layout.root, layout.base, id).catch(() => []);
    await removeTree(dir);
  }
}
