/**
 * The pack half of a running bwrap workspace's fast export (docs/architecture.md,
 * "Export"): GNU tar reads /workspace straight from the sandbox's overlay, in a bwrap
 * sandbox of its own, and its archive goes to the host's extraction over one pipe. The
 * agent's `tar_out` relays every byte through its socket and its event loop; this does
 * not, which is what lets an export run at `tar | tar` speed.
 *
 * It only ever speeds up the plain case, and leaves every other one to the agent (whose
 * answer, refusal or error is then the export's): the path is a real file or directory
 * under /workspace with no symlink on the way, nothing in it is hard-linked, and neither
 * find nor tar says anything on stderr (an unreadable file, a file changed while read, a
 * socket skipped). The caller discards what it extracted and asks the agent then.
 *
 * The reader is no more powerful than the workspace's agent and sees less: it starts in
 * the launch step's mount namespace (where the overlay is mounted), then in a new bwrap
 * sandbox with every namespace unshared, no capabilities, the workspace's tree read-only
 * at /workspace and the host's programs read-only; nothing of the sandbox (its processes,
 * its /proc) can reach it. A symlink swapped in while it reads can only lead to the
 * host's public programs, and only into the user's own export.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { posix } from "node:path";
import type { Readable } from "node:stream";
import type { PackedPath } from "../backend.js";
import { sameProcessAlive } from "../common.js";
import { sandboxLayout } from "../linux/layout.js";
import { toolSandboxArgs } from "../linux/tool-sandbox.js";

/**
 * Shell run in the reader's sandbox; $1 is the path under /workspace ("" for the root),
 * already normalised by the caller (no `.`, `..` or empty component), $2 its parent and
 * $3 its last component. Exits 3 when the
 * path is not the plain case. The first stderr line names the type; find names a
 * hard-linked file on stderr and stops, which the caller takes as "not plain".
 */
const READER_SCRIPT = [
  "set -u",
  't=/workspace/$1; [ -n "$1" ] || t=/workspace',
  // realpath resolves every symlink: the same path back means none was on the way.
  'r=$(realpath -e -- "$t" 2>/dev/null) && [ "$r" = "$t" ] || exit 3',
  'if [ -d "$t" ]; then cd "$t" || exit 3; set -- .; type=directory',
  'elif [ -f "$t" ]; then cd "/workspace/$2" || exit 3; set -- "$3"; type=file',
  "else exit 3; fi",
  'echo "pyro-type $type" >&2',
  // Files, directories and symlinks only (the agent skips the rest too), no recursion in
  // tar: find's walk is the list, and it overlaps with tar's reading.
  "find \"$@\" \\( -type f -links +1 -fprintf /dev/stderr 'pyro-hardlink\\n' -quit \\) -o \\( -type f -o -type d -o -type l \\) -print0" +
    " | tar --null --no-recursion -T - --format=gnu -cf -",
].join("\n");

/**
 * Starts the reader for `rel` under /workspace of the running sandbox whose launch step
 * is `launch`; null when it cannot (an old layout, a launch step that is gone).
 */
export async function packWorkspacePath(
  dir: string,
  launch: { pid: number; start_time: string },
  rel: string,
): Promise<PackedPath | null> {
  const l = sandboxLayout(dir);
  if (!(await sameProcessAlive(launch.pid, launch.start_time))) return null;
  const argv = [
    `--mount=/proc/${launch.pid}/ns/mnt`,
    "--",
    "bwrap",
    ...toolSandboxArgs(),
    "--ro-bind",
    l.wsMerged,
    "/workspace",
    "--chdir",
    "/",
    "--",
    "/bin/sh",
    "-c",
    READER_SCRIPT,
    "pyro-export",
    rel,
    posix.dirname(rel) === "." ? "" : posix.dirname(rel),
    posix.basename(rel),
  ];
  const child = spawn("nsenter", argv, { stdio: ["ignore", "pipe", "pipe"] });
  return {
    stream: child.stdout as Readable,
    finished: outcome(child),
    // nsenter became bwrap, whose sandbox ends with it (--die-with-parent).
    stop: () => child.kill("SIGKILL"),
  };
}

/** What the reader said once it ended: the type of a plain path, else null (ask the agent). */
function outcome(child: ChildProcess): Promise<{ artifact_type: "file" | "directory" } | null> {
  let err = "";
  child.stderr?.on("data", (c: Buffer) => {
    if (err.length < 4096) err += c.toString("utf8");
  });
  return new Promise((resolve) => {
    child.on("error", () => resolve(null));
    child.on("close", (code) => {
      const m = /^pyro-type (file|directory)\n$/.exec(err);
      resolve(code === 0 && m ? { artifact_type: m[1] as "file" | "directory" } : null);
    });
  });
}
