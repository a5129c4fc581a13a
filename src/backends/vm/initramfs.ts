import { createHash } from "node:crypto";
import { chmod, copyFile, mkdir, mkdtemp, readFile, rename, rm, symlink, writeFile } from "node:fs/promises";
import { basename, join } from "node:path";
import { PyroError } from "../../errors.js";
import { exists } from "../../util/fs.js";
import { firstLine, run, which } from "../../util/run.js";
import type { UnpackedKernel } from "./kernel.js";
import { DISK_SERIAL, GUEST } from "./types.js";

/**
 * Stage 1, the initramfs's /init (busybox sh, PID 1): load the virtio modules in
 * dependency order, find the disks by virtio serial (microvm enumerates devices in
 * reverse order, and there is no udev), mount the environment read-only under a
 * writable overlay kept on the state disk, move the agent and state disks under
 * /run/pyro, and switch to the new root. Any failure powers the VM off with the reason
 * on the console, so the host sees a dead VM and the log, never a hang.
 */
export const STAGE1_INIT = `#!/bin/sh
export PATH=/bin
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
die() { echo "pyro-init: $*"; poweroff -f; sleep 5; exit 1; }
mmio=""
disks=""
for a in $(cat /proc/cmdline); do
  case "$a" in
    virtio_mmio.device=*) mmio="$mmio device=\${a#virtio_mmio.device=}" ;;
    pyro.disks=*) disks="\${a#pyro.disks=}" ;;
  esac
done
for m in $(cat /modules.order); do
  if [ "$m" = virtio_mmio.ko ]; then insmod /lib/modules/$m $mmio || die "insmod $m"
  else insmod /lib/modules/$m || die "insmod $m"; fi
done
# A disk's device: by virtio serial, or from pyro.disks=NAME:vdX,... (Firecracker has no serials).
disk() {
  for map in $(echo "$disks" | tr , ' '); do
    [ "\${map%%:*}" = "$1" ] && { echo "/dev/\${map#*:}"; return 0; }
  done
  for d in /sys/block/vd*; do
    [ -e "$d/serial" ] && [ "$(cat "$d/serial")" = "$2" ] && { echo "/dev/\${d##*/}"; return 0; }
  done
  return 1
}
wait_disk() {
  i=0
  while [ $i -lt 500 ]; do
    dev=$(disk "$1" "$2") && [ -b "$dev" ] && { echo "$dev"; return 0; }
    usleep 10000; i=$((i + 1))
  done
  die "no $1 disk (serial $2)"
}
env=$(wait_disk env ${DISK_SERIAL.env}) || exit 1
agent=$(wait_disk agent ${DISK_SERIAL.agent}) || exit 1
state=$(wait_disk state ${DISK_SERIAL.state}) || exit 1
mount -t ext4 -o ro,noload "$env" /mnt/env || die "mount env $env"
mount -t ext4 -o ro,noload "$agent" /mnt/agent || die "mount agent $agent"
mount -t ext4 -o rw,noatime "$state" /mnt/state || die "mount state $state"
mkdir -p /mnt/state/root/upper /mnt/state/root/work /mnt/state/ws/upper /mnt/state/ws/work /mnt/state/snapshots
mount -t overlay overlay -o lowerdir=/mnt/env,upperdir=/mnt/state/root/upper,workdir=/mnt/state/root/work /newroot || die "mount root overlay"
mkdir -p /newroot/run /newroot/workspace /newroot/tmp /newroot/proc /newroot/sys /newroot/dev
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /newroot/run
mkdir -p /newroot${GUEST.agentDir} /newroot${GUEST.stateDir} /newroot${GUEST.seedDir} /newroot${GUEST.snapshotsDir}
mount --move /mnt/agent /newroot${GUEST.agentDir}
mount --move /mnt/state /newroot${GUEST.stateDir}
mount --bind /newroot${GUEST.stateDir}/snapshots /newroot${GUEST.snapshotsDir}
mount --move /dev /newroot/dev
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
exec switch_root /newroot ${GUEST.agentDir}/bin/busybox sh ${GUEST.agentDir}/stage2.sh
die "switch_root failed"
`;

/** Builds (or finds cached) the initramfs for `kernel`: busybox, the modules, stage 1. */
export async function prepareInitramfs(
  cacheDir: string,
  kernel: UnpackedKernel,
  signal?: AbortSignal,
): Promise<string> {
  const busybox = await staticBusybox();
  const key = createHash("sha256")
    .update(JSON.stringify([kernel.version, kernel.modules.map((m) => basename(m)), STAGE1_INIT]))
    .update(await readFile(busybox))
    .digest("hex")
    .slice(0, 16);
  const out = join(cacheDir, `initrd-${key}.cpio`);
  if (await exists(out)) return out;
  await mkdir(cacheDir, { recursive: true });
  const tmp = await mkdtemp(join(cacheDir, ".initrd-"));
  try {
    const root = join(tmp, "root");
    for (const d of [
      "bin",
      "dev",
      "proc",
      "sys",
      "mnt/env",
      "mnt/agent",
      "mnt/state",
      "newroot",
      "lib/modules",
    ])
      await mkdir(join(root, d), { recursive: true });
    await copyFile(busybox, join(root, "bin", "busybox"));
    await chmod(join(root, "bin", "busybox"), 0o755);
    for (const applet of [
      "sh",
      "mount",
      "insmod",
      "switch_root",
      "mkdir",
      "cat",
      "tr",
      "usleep",
      "poweroff",
      "sleep",
      "echo",
    ])
      await symlink("busybox", join(root, "bin", applet));
    for (const m of kernel.modules) await copyFile(m, join(root, "lib", "modules", basename(m)));
    await writeFile(join(root, "modules.order"), `${kernel.modules.map((m) => basename(m)).join("\n")}\n`);
    await writeFile(join(root, "init"), STAGE1_INIT, { mode: 0o755 });
    // busybox cpio reads the file list on stdin; the kernel takes an uncompressed newc archive.
    const r = await run(
      [
        "sh",
        "-c",
        'cd "$1" && find . | sort | "$2" cpio -o -H newc > "$3"',
        "sh",
        root,
        busybox,
        `${out}.tmp`,
      ],
      { timeoutMs: 60_000, ...(signal ? { signal } : {}) },
    );
    if (r.exitCode !== 0)
      throw new PyroError("internal", `building the initramfs failed: ${firstLine(r.stderr)}`);
    await rename(`${out}.tmp`, out);
    return out;
  } finally {
    await rm(tmp, { recursive: true, force: true });
    await rm(`${out}.tmp`, { force: true });
  }
}

/** The host's statically linked busybox (Debian package busybox-static). */
export async function staticBusybox(): Promise<string> {
  const bin = await which("busybox");
  if (!bin)
    throw new PyroError(
      "backend_unavailable",
      "busybox is not installed",
      "install the Debian package busybox-static (npm run setup)",
    );
  const ldd = await run(["ldd", bin], { timeoutMs: 10_000 });
  if (!/not a dynamic executable|statically linked/.test(ldd.stdout + ldd.stderr))
    throw new PyroError(
      "backend_unavailable",
      `${bin} is dynamically linked; the guest needs a static one`,
      "install the Debian package busybox-static",
    );
  return bin;
}
