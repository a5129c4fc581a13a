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
 * The reader sees nothing of the host (tree-tar.ts): whatever the workspace does while
 * it reads (a directory swapped for a symlink to `/usr` between the check and the read),
 * a path can only lead into the workspace's own tree, to tar's own files, or nowhere.
 */
import type { ChildProcess } from "node:child_process";
import { lstatSync } from "node:fs";
import { join, posix } from "node:path";
import type { Readable } from "node:stream";
import type { PackedPath } from "../backend.js";
import { sandboxLayout } from "../linux/layout.js";
import { spawnTreeTar } from "./tree-tar.js";

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
  const child = await spawnTreeTar(dir, launch, {
    workspace: "read-only",
    cwd: what.cwd,
    args: ["--format=gnu", "--numeric-owner", "-cf", "-", "--", what.name],
    stdin: "ignore",
  });
  if (!child) return null;
  return {
    stream: child.stdout as Readable,
    finished: outcome(child, what.type),
    // Its next write fails and it exits. Not killed: a bwrap killed while it sets up its
    // sandbox leaves the sandbox's first process waiting for it forever.
    stop: () => child.stdout?.destroy(),
  };
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
