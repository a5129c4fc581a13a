/**
 * The write half of a push into a running bwrap workspace without its agent
 * (core/push-direct.ts): GNU tar extracts the host's archive into /workspace straight
 * through the sandbox's overlay, in a sandbox of its own that can write /workspace and
 * sees nothing of the host (tree-tar.ts). The agent's `tar_in` receives every byte
 * through its socket, spools the archive and validates it before it extracts; here the
 * host checks its own tree and the destination before a byte moves (push-direct.ts), so
 * the archive flows from one GNU tar to the other as in `tar | tar`.
 *
 * GNU tar runs as the agent's does (`--no-same-owner`, as the sandbox's root), so what it
 * makes is what `tar_in` makes. A destination directory that is missing is made first by
 * the same sandbox from an archive of its directories (mode 0755, as the agent's mkdir
 * under its umask 022): a host-side mkdir through the view would follow a symlink the
 * workspace planted onto the host.
 */
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import * as tar from "tar";
import type { WorkspaceWriter } from "../backend.js";
import { sameProcessAlive } from "../common.js";
import { sandboxLayout } from "../linux/layout.js";
import { spawnTreeTar } from "./tree-tar.js";

/** The writer of the running sandbox whose launch step is `launch`; null when it is gone. */
export async function workspaceWriter(
  dir: string,
  launch: { pid: number; start_time: string },
): Promise<WorkspaceWriter | null> {
  if (!(await sameProcessAlive(launch.pid, launch.start_time))) return null;
  return {
    view: `/proc/${launch.pid}/root${sandboxLayout(dir).wsMerged}`,
    unpack: async (rel, archive, missing, signal) => {
      if (missing.length > 0) {
        const dirs = directoriesArchive(missing);
        if (!dirs) return { started: false, code: null, said: "a directory to make has a long name" };
        const made = await extract(dir, launch, "", async () => dirs);
        if (!made.started || made.code !== 0) return made;
      }
      return extract(dir, launch, rel, archive, signal);
    },
  };
}

/** GNU tar extracting `archive()` into /workspace/`cwd`: whether it ran, its exit code and its last words. */
async function extract(
  dir: string,
  launch: { pid: number; start_time: string },
  cwd: string,
  archive: () => Promise<Readable>,
  signal?: AbortSignal,
): Promise<{ started: boolean; code: number | null; said: string }> {
  // -i: read to the end (tar would stop at the end-of-archive blocks while the host
  // still writes them).
  const child = await spawnTreeTar(dir, launch, {
    workspace: "writable",
    cwd,
    args: ["-x", "-i", "-f", "-", "--no-same-owner"],
    stdin: "pipe",
  });
  if (!child) return { started: false, code: null, said: "GNU tar or the sandbox is missing" };
  let said = "";
  child.stderr?.on("data", (c: Buffer) => {
    if (said.length < 4096) said += c.toString("utf8");
  });
  child.stdout?.resume();
  const exited = new Promise<number | null>((resolve) => {
    child.on("error", () => resolve(null));
    child.on("close", (code) => resolve(code));
  });
  // On a failure both ends close: tar reads the end of its input and exits (never killed).
  const input = await archive().catch(() => null);
  const fed =
    input !== null &&
    (await pipeline(input, child.stdin!, signal ? { signal } : {}).then(
      () => true,
      () => false,
    ));
  if (!input) child.stdin?.end();
  const code = await exited;
  const last = said.trim().split("\n").slice(-2).join(" | ");
  if (fed) return { started: true, code, said: last };
  return { started: true, code: code || 1, said: last || "the archive ended early" };
}

/** A tar archive of directory entries (mode 0755, parents first); null for a name over 99 bytes. */
function directoriesArchive(dirs: string[]): Readable | null {
  const blocks: Buffer[] = [];
  for (const d of dirs) {
    const h = new tar.Header({ path: `${d}/`, type: "Directory", mode: 0o755, mtime: new Date(), size: 0 });
    const block = Buffer.alloc(512);
    if (Buffer.byteLength(d) > 99 || h.encode(block)) return null;
    blocks.push(block);
  }
  blocks.push(Buffer.alloc(1024));
  return Readable.from([Buffer.concat(blocks)]);
}
