/**
 * The pack half of a running bwrap workspace's fast export (docs/architecture.md,
 * "Export"): GNU tar reads /workspace straight from the sandbox's overlay, in a bwrap
 * sandbox of its own, and its archive goes to the host's extraction over one pipe. The
 * agent's `tar_out` relays every byte through its socket and its event loop; this does
 * not, which is what lets an export run at `tar | tar` speed.
 *
 * It only ever speeds up the plain case, and leaves every other one to the agent (whose
 * answer, refusal or error is then the export's): the path is a real file or directory
 * under /workspace with no symlink on the way and no other hard link, and tar reads all
 * of it (exit 0: no unreadable file, none that changed while read). What tar archives
 * that the export rules refuse (a hard link, a device) fails the host's extraction or its
 * walk, and the caller then asks the agent; FIFOs, which the agent skips, are removed
 * by the walk.
 *
 * The reader sees nothing of the host: its sandbox (every namespace unshared, no
 * capabilities, no environment, no /proc or /dev) holds the workspace's tree read-only at
 * /workspace and GNU tar with its loader and libraries at /run/tar, started through the
 * loader, and nothing else. So whatever the workspace does while it reads (a directory
 * swapped for a symlink to `/usr` between the check and the read), a path can only lead
 * into the workspace's own tree, to tar's own files, or nowhere; and the workspace cannot
 * reach the reader (another pid namespace). The launch step's mount namespace, where the
 * overlay is mounted, is entered through a descriptor opened after the launch step was
 * checked, so a recycled pid cannot send the reader elsewhere.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { closeSync, lstatSync, openSync } from "node:fs";
import { basename, join, posix } from "node:path";
import type { Readable } from "node:stream";
import { findGnuTar } from "../../agent/tarsafe.js";
import { run } from "../../util/run.js";
import type { PackedPath } from "../backend.js";
import { sameProcessAlive } from "../common.js";
import { sandboxLayout } from "../linux/layout.js";

/** Where the reader's sandbox has GNU tar: the program, its loader and its libraries. */
const TOOLS = "/run/tar";

/** GNU tar and what it loads, as bwrap binds into {@link TOOLS}; null without GNU tar. */
let tarFiles: Promise<{ binds: string[]; argv: string[] } | null> | undefined;

function readerTar(): Promise<{ binds: string[]; argv: string[] } | null> {
  tarFiles ??= (async () => {
    const tar = await findGnuTar();
    if (!tar) return null;
    // `ldd` names each library (`soname => path`) and the loader (an absolute path).
    const r = await run(["ldd", tar], { timeoutMs: 10_000 });
    if (r.exitCode !== 0) return null;
    const binds = ["--ro-bind", tar, `${TOOLS}/tar`];
    let loader = "";
    for (const line of r.stdout.split("\n")) {
      const lib = /^\s*(\S+) => (\/\S+) \(/.exec(line);
      if (lib) binds.push("--ro-bind", lib[2]!, `${TOOLS}/lib/${basename(lib[1]!)}`);
      const interp = /^\s*(\/\S+) \(/.exec(line);
      if (interp) loader = interp[1]!;
    }
    if (!loader) return null;
    binds.push("--ro-bind", loader, `${TOOLS}/ld.so`);
    return { binds, argv: [`${TOOLS}/ld.so`, "--library-path", `${TOOLS}/lib`, `${TOOLS}/tar`] };
  })();
  return tarFiles;
}

/**
 * The type of /workspace/`rel` when it is the plain case: every component a real
 * directory (no symlink), the last a directory or a file with one link. Read through the
 * launch step's view of the overlay; a race only changes what the reader finds in its
 * sandbox, never what it can reach.
 */
function plainType(merged: string, launchPid: number, rel: string): "file" | "directory" | null {
  let at = `/proc/${launchPid}/root${merged}`;
  const parts = rel === "" ? [] : rel.split("/");
  try {
    for (const [i, part] of parts.entries()) {
      at = join(at, part);
      const st = lstatSync(at);
      if (i < parts.length - 1 && !st.isDirectory()) return null;
      if (i === parts.length - 1) {
        if (st.isDirectory()) return "directory";
        return st.isFile() && st.nlink === 1 ? "file" : null;
      }
    }
    return lstatSync(at).isDirectory() ? "directory" : null;
  } catch {
    return null;
  }
}

/**
 * Starts the reader for `rel` under /workspace of the running sandbox whose launch step
 * is `launch`; null when it is not the plain case or cannot start now.
 */
export async function packWorkspacePath(
  dir: string,
  launch: { pid: number; start_time: string },
  rel: string,
): Promise<PackedPath | null> {
  const type = plainType(sandboxLayout(dir).wsMerged, launch.pid, rel);
  if (!type) return null;
  const [cwd, name] = type === "directory" ? [rel, "."] : [posix.dirname(rel), posix.basename(rel)];
  return startReader(dir, launch, { cwd: cwd === "." ? "" : cwd, name, type });
}

/**
 * The reader itself: GNU tar archiving `name` in /workspace/`cwd`, in its sandbox (see
 * the top of the file); null when GNU tar or the launch step is missing. Exported for the
 * tests, which start it where a race would (on a path that is no longer plain).
 */
export async function startReader(
  dir: string,
  launch: { pid: number; start_time: string },
  what: { cwd: string; name: string; type: "file" | "directory" },
): Promise<PackedPath | null> {
  const tar = await readerTar();
  if (!tar) return null;
  let ns: number;
  try {
    ns = openSync(`/proc/${launch.pid}/ns/mnt`, "r");
  } catch {
    return null;
  }
  try {
    // The descriptor is the launch step's namespace only if the launch step is still it.
    if (!(await sameProcessAlive(launch.pid, launch.start_time))) return null;
    const argv = [
      "--mount=/proc/self/fd/3",
      "--",
      "bwrap",
      "--unshare-all",
      "--die-with-parent",
      "--new-session",
      "--cap-drop",
      "ALL",
      "--clearenv",
      "--ro-bind",
      sandboxLayout(dir).wsMerged,
      "/workspace",
      ...tar.binds,
      "--chdir",
      what.cwd === "" ? "/workspace" : `/workspace/${what.cwd}`,
      "--",
      ...tar.argv,
      "--format=gnu",
      "--numeric-owner",
      "-cf",
      "-",
      "--",
      what.name,
    ];
    const child = spawn("nsenter", argv, { stdio: ["ignore", "pipe", "pipe", ns] });
    return {
      stream: child.stdout as Readable,
      finished: outcome(child, what.type),
      // Its next write fails and it exits. Not killed: a bwrap killed while it sets up
      // its sandbox leaves the sandbox's first process waiting for it forever.
      stop: () => child.stdout?.destroy(),
    };
  } finally {
    closeSync(ns);
  }
}

/**
 * The path's type once the reader ended cleanly, else null. GNU tar exits 0 only when
 * it read everything: a file it could not open or read, one that vanished or changed
 * while read, makes it exit 1 or 2; what it says with 0 (a socket ignored, which the
 * agent skips too) does not matter.
 */
function outcome(
  child: ChildProcess,
  type: "file" | "directory",
): Promise<{ artifact_type: "file" | "directory" } | null> {
  child.stderr?.resume();
  return new Promise((resolve) => {
    child.on("error", () => resolve(null));
    child.on("close", (code) => resolve(code === 0 ? { artifact_type: type } : null));
  });
}
