import { readFile } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { exists } from "../../util/fs.js";
import { acquireLock } from "../../util/lock.js";
import type { SandboxSpec } from "../backend.js";
import { prepareNodeRuntime } from "../runtime.js";
import { prepareAgentDisk } from "./agent-disk.js";
import { mkfsExt4 } from "./disks.js";
import { prepareInitramfs, staticBusybox } from "./initramfs.js";
import { prepareKernel } from "./kernel.js";
import { prepareSetupHelper } from "./setup-helper.js";
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
  const setupHelper = await prepareSetupHelper(cache, options.signal);
  if (!setupHelper.path)
    options.onProgress?.(
      `warning: ${setupHelper.reason}; restored VMs set up with a slower shell and reseed their RNG only on the kernel's schedule`,
    );
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
      { appDir: spec.appDir, runtime, busybox, bridge, setupHelper: setupHelper.path },
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
      cmdline: kernelCmdline(),
      tcgCmdline: await tcgCmdline(),
      setupHelper: setupHelper.path !== null,
    };
  } finally {
    await release();
  }
}

/**
 * Kernel arguments that boot this kernel fast (see MACHINE.md): no self-tests, one UART,
 * no keyboard controller, and a panic ends the VM.
 */
export function kernelCmdline(): string[] {
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
    "panic=-1",
    // microvm has no reset device the kernel's default reboot methods find: a reboot (and
    // so a panic) would spin forever. A triple fault resets, and -no-reboot turns that
    // into QEMU exiting.
    "reboot=t",
    "rdinit=/init",
  ];
}

/**
 * Under TCG `-M microvm` hangs at TSC calibration unless the kernel is told the rate: the
 * host's. Not used with KVM, where the kernel measures the real TSC.
 */
export async function tcgCmdline(): Promise<string[]> {
  return [`tsc_early_khz=${await hostTscKhz()}`, "tsc=reliable"];
}

/**
 * The host's TSC rate in kHz: the kernel's own figure where it exports one, else the
 * boot-time "cpu MHz" (stable on VMs; varies with frequency scaling on bare metal), else 2 GHz.
 */
export async function hostTscKhz(): Promise<number> {
  const sys = Number(
    (await readFile("/sys/devices/system/cpu/cpu0/tsc_freq_khz", "utf8").catch(() => "")).trim(),
  );
  if (Number.isFinite(sys) && sys > 0) return sys;
  const text = await readFile("/proc/cpuinfo", "utf8").catch(() => "");
  const mhz = Number(/^cpu MHz\s*:\s*([\d.]+)/m.exec(text)?.[1]);
  return Number.isFinite(mhz) && mhz > 0 ? Math.round(mhz * 1000) : 2_000_000;
}
