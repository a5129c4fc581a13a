import { readFile, stat } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { acquireLock } from "../../util/lock.js";
import type { SandboxSpec } from "../backend.js";
import { prepareNodeRuntime } from "../runtime.js";
import { prepareAgentDisk } from "./agent-disk.js";
import { mkfsExt4 } from "./disks.js";
import { prepareInitramfs, staticBusybox } from "./initramfs.js";
import { prepareKernel } from "./kernel.js";
import type { VmArtifacts } from "./types.js";

export interface PrepareOptions {
  signal?: AbortSignal;
  /** Progress lines for long builds (kernel download, disk images). */
  onProgress?: (line: string) => void;
  /** Builds the guest's vsock bridge (Firecracker); null when it cannot be built. */
  vsockBridge?: (cacheDir: string) => Promise<string | null>;
}

/**
 * Where VM artifacts are cached: `.vm/` beside the environments (the kernel, initramfs and
 * environment disks are keyed by what they are built from, so every pyro home sharing an
 * environment cache shares them).
 */
export function vmCacheDir(spec: Pick<SandboxSpec, "rootfs">): string {
  return join(dirname(dirname(spec.rootfs)), ".vm");
}

/**
 * The kernel, initramfs, environment disk and agent disk for `spec`, built on first use
 * and cached (keyed by what they are built from).
 */
export async function prepareVmArtifacts(
  spec: SandboxSpec,
  options: PrepareOptions = {},
): Promise<VmArtifacts> {
  const cache = vmCacheDir(spec);
  const sig = options.signal ? { signal: options.signal } : {};
  const kernel = await prepareKernel(cache, {
    ...sig,
    ...(options.onProgress ? { onProgress: options.onProgress } : {}),
  });
  const runtime = await prepareNodeRuntime(spec.runtimeCacheDir, sig);
  const busybox = await staticBusybox();
  const bridge = options.vsockBridge ? await options.vsockBridge(cache) : null;
  const release = await acquireLock(join(cache, "images.lock"), sig);
  try {
    const initrd = await prepareInitramfs(cache, kernel, options.signal);
    const envDisk = join(cache, `env-${basename(dirname(spec.rootfs))}.ext4`);
    if (!(await exists(envDisk))) {
      options.onProgress?.(`building the disk image of ${basename(dirname(spec.rootfs))}`);
      await mkfsExt4(envDisk, { dir: spec.rootfs, label: "pyro-env", readOnly: true, ...sig });
    }
    const agentDisk = await prepareAgentDisk(
      cache,
      { appDir: spec.appDir, runtime, busybox, bridge },
      options.signal,
    );
    return {
      image: {
        key: basename(initrd, ".cpio"),
        kernelRelease: kernel.release,
        kernel: kernel.vmlinuz,
        vmlinux: kernel.vmlinux ?? "",
        initrd,
      },
      envDisk,
      agentDisk,
      cmdline: await kernelCmdline(),
    };
  } finally {
    await release();
  }
}

/**
 * Kernel arguments that boot this kernel fast under emulation (see MACHINE.md): the TSC
 * rate from the host (calibration hangs `-M microvm` under TCG otherwise), no
 * self-tests, one UART, no keyboard controller, and a panic powers the VM off.
 */
export async function kernelCmdline(): Promise<string[]> {
  return [
    "console=ttyS0",
    "quiet",
    "loglevel=0",
    "mitigations=off",
    "cryptomgr.notests",
    "nokaslr",
    "no_timer_check",
    "8250.nr_uarts=1",
    "i8042.noaux",
    "i8042.nokbd",
    "i8042.nopnp",
    `tsc_early_khz=${await hostTscKhz()}`,
    "tsc=reliable",
    "panic=-1",
    "rdinit=/init",
  ];
}

/** The host's TSC rate in kHz (from /proc/cpuinfo; 2 GHz when it cannot be read). */
export async function hostTscKhz(): Promise<number> {
  const text = await readFile("/proc/cpuinfo", "utf8").catch(() => "");
  const mhz = Number(/^cpu MHz\s*:\s*([\d.]+)/m.exec(text)?.[1]);
  return Number.isFinite(mhz) && mhz > 0 ? Math.round(mhz * 1000) : 2_000_000;
}

async function exists(p: string): Promise<boolean> {
  return stat(p).then(
    () => true,
    () => false,
  );
}
