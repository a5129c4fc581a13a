/**
 * Ops that exist only inside a pyro microVM (agent started with `--vm DIR`):
 *
 * - `vm_setup`: after every start, cold or restored from the template's saved state. A
 *   restored VM carries the template's clock and RNG state, so the host's clock is set
 *   and fresh host entropy is mixed into the kernel pool before anything else runs; then
 *   /workspace is mounted: an overlay of the seed disk (the snapshot it starts from,
 *   read-only) under the workspace's upper layer on the state disk. The seed disk is
 *   mounted only now because the template was saved without it (each workspace's differs).
 * - `vm_snapshot_in`: puts another snapshot tree into the guest (to diff against it).
 * - `vm_sync`: flushes the guest's page cache to its disks before the host stops the VM.
 */
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { AgentError } from "../../errors.js";
import { DISK_SERIAL, GUEST } from "../../vm-layout.js";
import { Workspace } from "../paths.js";
import type { OpContext, OpHandler } from "./context.js";
import { tarIn } from "./tar.js";

const run = promisify(execFile);

function vmOnly(ctx: OpContext): string {
  if (!ctx.vmDir) throw new AgentError("invalid_argument", "this op exists only inside a pyro microVM");
  return ctx.vmDir;
}

async function busybox(vmDir: string, ...args: string[]): Promise<void> {
  try {
    await run(path.join(vmDir, "bin", "busybox"), args, { timeout: 60_000 });
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new AgentError("internal", `${args.join(" ")}: ${(e.stderr || e.message).trim()}`);
  }
}

/** The block device of the disk with virtio serial `serial` (or from pyro.disks= on the command line). */
export async function diskBySerial(serial: string, name: string): Promise<string> {
  const cmdline = await readFile("/proc/cmdline", "utf8").catch(() => "");
  const map = /(?:^|\s)pyro\.disks=(\S+)/.exec(cmdline)?.[1];
  for (const pair of map?.split(",") ?? []) {
    const [n, dev] = pair.split(":");
    if (n === name && dev) return `/dev/${dev}`;
  }
  for (const d of await readdir("/sys/block").catch(() => [])) {
    if (!d.startsWith("vd")) continue;
    const s = (await readFile(`/sys/block/${d}/serial`, "utf8").catch(() => "")).trim();
    if (s === serial) return `/dev/${d}`;
  }
  throw new AgentError("not_found", `no ${name} disk (virtio serial ${serial}) in this VM`);
}

async function isMountPoint(p: string): Promise<boolean> {
  const info = await readFile("/proc/self/mountinfo", "utf8");
  return info.split("\n").some((l) => l.split(" ")[4] === p);
}

export const vmSetup: OpHandler<"vm_setup"> = async (args, ctx) => {
  const vmDir = vmOnly(ctx);
  const started = performance.now();
  const entropy = Buffer.from(args.entropy, "base64");
  await writeFile("/proc/sys/kernel/hostname", args.hostname);
  // One shell for the RNG, the clock and the mounts: every process start is slow under emulation.
  const bb = path.join(vmDir, "bin", "busybox");
  const steps = [`${bb} date -u -s @${Math.floor(args.time_ms / 1000)} >/dev/null`];
  const reseed = path.join(vmDir, "bin", "pyro-reseed");
  if (entropy.length >= 32 && (await exists(reseed))) {
    // Credit the host's bytes and reseed the CRNG now (a plain write to /dev/urandom
    // would leave the template's CRNG key in use until the kernel's next reseed).
    steps.push(`echo ${entropy.toString("base64")} | ${bb} base64 -d | ${reseed}`);
  } else if (entropy.length > 0) {
    await writeFile("/dev/urandom", entropy);
  }
  let mounted = false;
  if (!(await isMountPoint(GUEST.workspace))) {
    const seed = await diskBySerial(DISK_SERIAL.seed, "seed");
    const upper = `${GUEST.stateDir}/ws/upper`;
    const work = `${GUEST.stateDir}/ws/work`;
    await mkdir(upper, { recursive: true });
    await mkdir(work, { recursive: true });
    await mkdir(GUEST.workspace, { recursive: true });
    await mkdir(GUEST.seedDir, { recursive: true });
    if (!(await isMountPoint(GUEST.seedDir))) {
      // The template's kernel read this disk's first blocks (partition scan) when it was a
      // blank placeholder: drop that cache before the filesystem reads its superblock.
      steps.push(
        `${bb} blockdev --flushbufs ${seed}`,
        `${bb} mount -t ext4 -o ro,noload ${seed} ${GUEST.seedDir}`,
      );
    }
    steps.push(
      `${bb} mount -t overlay overlay -o lowerdir=${GUEST.seedDir},upperdir=${upper},workdir=${work} ${GUEST.workspace}`,
    );
    mounted = true;
  }
  const shellStarted = performance.now();
  await busybox(vmDir, "sh", "-euc", steps.join("\n"));
  const shell_ms = Math.round(performance.now() - shellStarted);
  return {
    mounted,
    kernel: (await readFile("/proc/sys/kernel/osrelease", "utf8")).trim(),
    duration_ms: Math.round(performance.now() - started),
    shell_ms,
  };
};

export const vmSnapshotIn: OpHandler<"vm_snapshot_in"> = async (args, ctx) => {
  vmOnly(ctx);
  const final = path.join(GUEST.snapshotsDir, args.name);
  if (await exists(final)) {
    ctx.upload?.resume();
    return { path: final, files: 0, bytes: 0 };
  }
  // A private partial directory per request: two uploads of one snapshot never mix.
  const partial = path.join(GUEST.snapshotsDir, `.partial-${args.name}-${randomBytes(6).toString("hex")}`);
  await mkdir(partial, { recursive: true });
  try {
    const r = await tarIn({ dest: "." }, { ...ctx, workspace: await Workspace.open(partial) });
    try {
      await rename(partial, final);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      // Someone else finished the same snapshot first: theirs is as good.
      if (code !== "ENOTEMPTY" && code !== "EEXIST") throw err;
    }
    return { path: final, files: r.files, bytes: r.bytes };
  } finally {
    await rm(partial, { recursive: true, force: true });
  }
};

async function exists(p: string): Promise<boolean> {
  return stat(p).then(
    () => true,
    () => false,
  );
}

export const vmSync: OpHandler<"vm_sync"> = async (_args, ctx) => {
  const vmDir = vmOnly(ctx);
  const started = performance.now();
  await busybox(vmDir, "sync");
  return { duration_ms: Math.round(performance.now() - started) };
};
