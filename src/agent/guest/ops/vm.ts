/**
 * Ops that exist only inside a pyro microVM (agent started with `--vm DIR`):
 *
 * - `vm_setup`: after every start, cold or restored from the template's saved state. A
 *   restored VM carries the template's clock and RNG state, so the host's clock is set
 *   and fresh host entropy is credited to the kernel pool before anything else runs; then
 *   /workspace is mounted: an overlay of the seed disk (the snapshot it starts from,
 *   read-only) under the workspace's upper layer on the state disk. The seed disk is
 *   mounted only now because the template was saved without it (each workspace's differs).
 *   One static helper does it all (a busybox shell where the host could not build it).
 * - `vm_snapshot_in`: puts another snapshot tree into the guest (to diff against it).
 * - `vm_sync`: flushes the guest's page cache to its disks before the host stops the VM.
 */
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import net from "node:net";
import { release } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { AgentError } from "../../errors.js";
import type { OpParsedArgs } from "../../op-schemas.js";
import { DISK_SERIAL, GUEST, SETUP_HELPER } from "../../vm-layout.js";
import { Workspace } from "../paths.js";
import type { OpContext, OpHandler } from "./context.js";

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
  // The helper takes up to 512 bytes (the kernel's RNDADDENTROPY buffer it fills).
  const hex = entropy.subarray(0, 512).toString("hex");
  const request = `${args.hostname} ${Math.floor(args.time_ms)} ${hex}${args.mount === false ? " nomount" : ""}`;
  const mounted =
    entropy.length < 32
      ? await setupByShell(vmDir, args, entropy)
      : ((await askSetupServer(request)) ??
        (await runSetupHelper(vmDir, request)) ??
        (await setupByShell(vmDir, args, entropy)));
  const ms = Math.round(performance.now() - started);
  // uname(2), synchronous: a file read would be one more thread-pool round trip.
  return { mounted, kernel: release(), duration_ms: ms, shell_ms: ms };
};

/** The helper's reply line → mounted, or the helper's error. */
function setupReply(line: string): boolean {
  const m = /^ok mounted=([01])$/.exec(line.trim());
  if (!m)
    throw new AgentError("internal", `${SETUP_HELPER}: ${line.trim().replace(/^error /, "") || "no reply"}`);
  return m[1] === "1";
}

/**
 * vm_setup by the helper's server (started by stage 2, already running in a restored
 * clone): one unix socket round trip, no process started. Null when it is not there
 * (a disk without the helper, or the server restarting).
 */
function askSetupServer(request: string): Promise<boolean | null> {
  return new Promise((resolve, reject) => {
    const sock = net.connect({ path: GUEST.setupSocket });
    let reply = "";
    sock.setEncoding("utf8");
    sock.setTimeout(60_000, () => sock.destroy(new Error("no reply within 60 s")));
    sock.on("connect", () => sock.end(`${request}\n`));
    sock.on("data", (d: string) => {
      reply += d;
    });
    sock.on("error", (err: NodeJS.ErrnoException) => {
      if (err.code === "ENOENT" || err.code === "ECONNREFUSED") resolve(null);
      else reject(new AgentError("internal", `${SETUP_HELPER} server: ${err.message}`));
    });
    sock.on("close", (hadError) => {
      if (hadError) return;
      try {
        resolve(setupReply(reply));
      } catch (err) {
        reject(err);
      }
    });
  });
}

/** vm_setup by the helper as a process of its own; null when the agent disk has none. */
function runSetupHelper(vmDir: string, request: string): Promise<boolean | null> {
  const argv = [
    "--once",
    DISK_SERIAL.seed,
    GUEST.seedDir,
    GUEST.workspaceUpper,
    GUEST.workspaceWork,
    GUEST.workspace,
    ...request.split(" "),
  ];
  return new Promise((resolve, reject) => {
    execFile(path.join(vmDir, "bin", SETUP_HELPER), argv, { timeout: 60_000 }, (err, stdout, stderr) => {
      if ((err as NodeJS.ErrnoException | null)?.code === "ENOENT") return resolve(null);
      try {
        resolve(setupReply(stdout || stderr || (err?.message ?? "")));
      } catch (e) {
        reject(e);
      }
    });
  });
}

/** vm_setup without the helper: one busybox shell (every process start is slow under emulation). */
async function setupByShell(
  vmDir: string,
  args: OpParsedArgs<"vm_setup">,
  entropy: Buffer,
): Promise<boolean> {
  await writeFile("/proc/sys/kernel/hostname", args.hostname);
  const bb = path.join(vmDir, "bin", "busybox");
  const steps = [`${bb} date -u -s @${Math.floor(args.time_ms / 1000)} >/dev/null`];
  // Mixed in, not credited: without the helper the CRNG keeps the template's key until
  // the kernel's next scheduled reseed.
  if (entropy.length > 0) await writeFile("/dev/urandom", entropy);
  let mounted = false;
  if (args.mount !== false && !(await isMountPoint(GUEST.workspace))) {
    const seed = await diskBySerial(DISK_SERIAL.seed, "seed");
    const upper = GUEST.workspaceUpper;
    const work = GUEST.workspaceWork;
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
  await busybox(vmDir, "sh", "-euc", steps.join("\n"));
  return mounted;
}

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
    // Loaded here, not with this module: vm_setup runs in every start and needs no tar.
    const { tarIn } = await import("./tar.js");
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
