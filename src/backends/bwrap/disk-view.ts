import { closeSync, openSync } from "node:fs";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import type { Duplex } from "node:stream";
import { PyroError } from "../../errors.js";
import { exists } from "../../util/fs.js";
import { which } from "../../util/run.js";
import { agentApp } from "../agent-app.js";
import type { SandboxSpec } from "../backend.js";
import { spawnReader, sweepStale } from "../disk-reader.js";
import { agentArgv, sandboxHostname } from "../guest.js";
import { privateMountShell, readOnlyHostLine } from "../linux/launch.js";
import { detectLayout } from "../linux/layout.js";
import { prepareNodeRuntime } from "../runtime.js";
import { isolationArgs } from "./isolation.js";
import { writeSeccompFile } from "./seccomp.js";

/**
 * The disk reader of a stopped workspace whose files are on this host (bwrap, gVisor,
 * and the VMs' state disks once copied out): a read-only agent in a bwrap sandbox that
 * sees nothing but a read-only /workspace, the Node runtime and the pyro package.
 *
 * /workspace is an overlay with no upper layer (read-only by construction) whose lowers
 * are the workspace's writable layer (its upper directory, whose whiteouts and opaque
 * directories overlayfs honours in a lower too) over its snapshot tree. Everything is
 * mounted in the reader's own mount namespace, on a tmpfs over a private temp directory:
 * the mounts and the loop device (autoclear) go when the reader exits, whoever ends it.
 */

/** Prefix of a reader's temp directory: `<prefix><pid>-<random>`. */
const TEMP_PREFIX = "pyro-disk-";

/** Where the reader's sandbox mounts what it needs (as the bwrap backend does). */
const IN_READER = { workspace: "/workspace", runtime: "/run/pyro/runtime", app: "/run/pyro/app" } as const;

export interface DiskView {
  /** An ext4 image holding the upper layer, loop-mounted read-only; absent: `upper` is a host path. */
  image?: { path: string; options: string };
  /** The upper directory: relative to the image's root, or a host path; a missing one is no changes. */
  upper: string | null;
  /** The snapshot tree the writable layer is over. */
  lower: string;
  /** Removed (with everything in it) once the reader has exited. */
  scratch?: string;
}

/**
 * Mount options for a writable-layer image the host's kernel wrote (bwrap's disk.img):
 * read-only, journal not replayed (it was unmounted cleanly when its sandbox ended).
 */
export const HOST_IMAGE_OPTIONS = "ro,loop,noload,nosuid,nodev,noexec,nosymfollow";

/**
 * The mount script, run as `sh -c SCRIPT pyro-disk MNT IMAGE OPTS UPPER LOWER -- CMD...`
 * (IMAGE and OPTS empty without an image). Values arrive as positional arguments, never
 * spliced into the script text; the overlay's options name only directories under MNT.
 */
export const DISK_VIEW_SCRIPT = [
  "set -eu",
  "M=$1 image=$2 opts=$3 upper=$4 lower=$5; shift 6",
  'mount -t tmpfs -o mode=0700,size=1m pyro-disk "$M"',
  // The image's contents may be guest-written (a VM's state disk): no component of the
  // upper layer's path may be a symlink (this shell's / is the host's), and the image is
  // mounted nosymfollow besides.
  'if [ -n "$image" ]; then mkdir "$M/img"; mount -o "$opts" "$image" "$M/img"; p="$M/img"; rest=$upper',
  '  while [ -n "$rest" ]; do c=${rest%%/*}; if [ "$c" = "$rest" ]; then rest=; else rest=${rest#*/}; fi; p="$p/$c"',
  '    if [ -L "$p" ]; then echo "pyro-disk: a symlink in the path of the writable layer ($c)" >&2; exit 3; fi; done',
  "  upper=$p; fi",
  'if [ -n "$upper" ] && [ -e "$upper" ] && [ ! -d "$upper" ]; then echo "pyro-disk: the writable layer is not a directory" >&2; exit 3; fi',
  'mkdir "$M/lower" "$M/ws"',
  'mount --bind "$lower" "$M/lower"',
  'if [ -n "$upper" ] && [ -d "$upper" ]; then',
  '  mkdir "$M/upper"; mount --bind "$upper" "$M/upper"',
  '  mount -t overlay pyro-disk -o "ro,lowerdir=$M/upper:$M/lower" "$M/ws"',
  'else mount --bind -o ro "$M/lower" "$M/ws"; fi',
  // The host's device nodes and bwrap's binary, read-only (launch.ts readOnlyHostLine).
  readOnlyHostLine("mount"),
  'exec "$@"',
].join("\n");

/** Starts the reader for `view`; the channel speaks the agent protocol. */
export async function openDiskView(spec: SandboxSpec, view: DiskView): Promise<Duplex> {
  const bwrap = await which("bwrap");
  if (!bwrap) {
    if (view.scratch) await rm(view.scratch, { recursive: true, force: true });
    throw new PyroError(
      "backend_unavailable",
      "reading a stopped workspace's disk needs bubblewrap (its reader runs in a bwrap sandbox)",
      "install the Debian package bubblewrap",
    );
  }
  const runtime = await prepareNodeRuntime(spec.runtimeCacheDir);
  // Named by pid: a caller killed mid-read leaves it behind, and the next open sweeps it.
  await sweepStale(tmpdir(), TEMP_PREFIX);
  const dir = await mkdtemp(join(tmpdir(), `${TEMP_PREFIX}${process.pid}-`));
  const cleanup = async () => {
    await rm(dir, { recursive: true, force: true });
    if (view.scratch) await rm(view.scratch, { recursive: true, force: true });
  };
  let fd: number;
  try {
    await writeSeccompFile(join(dir, "seccomp.bpf"));
    fd = openSync(join(dir, "seccomp.bpf"), "r");
  } catch (err) {
    await cleanup();
    throw err;
  }
  const mnt = join(dir, "mnt");
  try {
    await mkdir(mnt, { mode: 0o700 });
    const agent = agentArgv(runtime, IN_READER, IN_READER.workspace, { stdio: true }, { readOnly: true });
    return spawnReader(
      [
        ...privateMountShell(["/bin/sh"], DISK_VIEW_SCRIPT, "pyro-disk"),
        mnt,
        view.image?.path ?? "",
        view.image?.options ?? "",
        view.upper ?? "",
        view.lower,
        "--",
        ...readerBwrapArgv(
          bwrap,
          spec,
          join(mnt, "ws"),
          { runtime: runtime.dir, app: await agentApp(spec) },
          agent,
        ),
      ],
      { extraFds: [fd], cleanup },
    );
  } catch (err) {
    await cleanup();
    throw err;
  } finally {
    closeSync(fd);
  }
}

/** The reader's bwrap argv: the workspace's isolation, plus only three read-only binds. */
export function readerBwrapArgv(
  bwrap: string,
  spec: Pick<SandboxSpec, "workspace_id">,
  merged: string,
  dirs: { runtime: string; app: string },
  agent: string[],
): string[] {
  return [
    bwrap,
    "--die-with-parent",
    ...isolationArgs(sandboxHostname(spec.workspace_id)),
    "--ro-bind",
    merged,
    IN_READER.workspace,
    "--ro-bind",
    dirs.runtime,
    IN_READER.runtime,
    "--ro-bind",
    dirs.app,
    IN_READER.app,
    "--tmpfs",
    "/tmp",
    "--chdir",
    IN_READER.workspace,
    "--",
    ...agent,
  ];
}

/** The view of a bwrap or gVisor workspace (linux/layout.ts): disk.img's ws/upper, or a legacy host upper. */
export async function linuxDiskView(spec: SandboxSpec): Promise<DiskView> {
  const l = await detectLayout(spec.dir);
  const lower = join(spec.snapshotsDir, spec.snapshot);
  if (l.legacy) return { upper: l.wsUpper, lower };
  if (!(await exists(l.disk))) return { upper: null, lower };
  return {
    image: { path: l.disk, options: HOST_IMAGE_OPTIONS },
    upper: relative(l.diskMount, l.wsUpper),
    lower,
  };
}
