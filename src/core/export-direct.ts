/**
 * The fast export of a running workspace (docs/architecture.md, "Export and push"): the backend's
 * reader packs the path with GNU tar straight from the workspace's tree
 * (backend.packWorkspacePath; bwrap/pack.ts), and GNU tar extracts it here in a bwrap
 * sandbox whose only writable path is the export's private staging directory. Two
 * processes and a pipe, as `tar | tar`; this process only relays and counts.
 *
 * The rules are those of every host-side write of sandbox data (untrusted-tar.ts): the
 * result is walked with lstat before it moves into place (files, directories and symlinks
 * that stay inside; no hard links, no setuid bits, the invoking user's files), the file
 * data is bounded by the workspace's archive budget as it streams (counted from the tar
 * headers), and GNU tar runs unprivileged with `-k --no-same-owner --no-same-permissions`
 * under this process's umask; the walk then gives the owner read and write (search on a
 * directory) where it lacks them. The modes are so those of the other extraction:
 * permission bits under the umask, no setuid, setgid or sticky bit, the owner's own. Anything but a clean run of both sides (a path that is not the plain case,
 * a reader or extractor that failed or said anything on stderr, a refused walk, the
 * budget) discards the staging directory and returns null: the caller exports through
 * the agent, whose answer (the export, or the refusal with its exact reason) counts.
 */
import { spawn } from "node:child_process";
import { chmodSync, utimesSync } from "node:fs";
import { Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { PackedPath, SandboxSpec, SandboxState, WorkspaceBackend } from "../backends/backend.js";
import { toolSandboxArgs } from "../backends/linux/tool-sandbox.js";
import { PyroError } from "../errors.js";
import { TarCounter } from "../util/tar-count.js";
import { ExportStaging } from "./transfer.js";
import { type Extracted, UNTRUSTED_LIMITS, verifyTree } from "./untrusted-tar.js";

/** Linux's longest path, with its NUL. */
const PATH_MAX = 4096;

export interface DirectExport {
  artifact_type: "file" | "directory";
  bytes: number;
  entries: number;
}

/**
 * A workspace path as the reader takes it: relative to /workspace, no `.`, `..` or empty
 * component ("" for the root); null for anything else (the agent resolves those).
 */
export function plainWorkspacePath(path: string): string | null {
  const rel = path === "/workspace" ? "" : path.startsWith("/workspace/") ? path.slice(11) : path;
  if (rel === "" || rel === ".") return "";
  if (rel.startsWith("/") || rel.endsWith("/")) return null;
  const parts = rel.split("/");
  if (parts.some((p) => p === "" || p === "." || p === "..")) return null;
  return rel;
}

/**
 * Exports `path` of the running workspace to `output` without its agent, or returns
 * null when the agent must do it (see the top of the file). Throws only what the agent
 * path would throw the same way: an output that is not empty, a cancellation.
 */
export async function exportDirect(
  backend: WorkspaceBackend,
  sandbox: { spec: SandboxSpec; state: SandboxState },
  path: string,
  output: string,
  options: { max_bytes?: number; signal?: AbortSignal } = {},
): Promise<DirectExport | null> {
  const rel = plainWorkspacePath(path);
  if (rel === null || !backend.packWorkspacePath) return null;
  const staging = new ExportStaging(output);
  await staging.begin();
  let pack: PackedPath | null = null;
  try {
    pack = await backend.packWorkspacePath(sandbox.spec, sandbox.state, rel);
    if (!pack) return null;
    const got = await extract(pack, staging.tree, options);
    if (!got) return null;
    const walked: Extracted = { files: 0, bytes: 0, entries: 0, top: [] };
    try {
      verifyTree(staging.tree, "export", output, walked, { gnu_tar: true });
      // GNU tar leaves the directory it extracts into as it was (`-k`): the archive's
      // own `./` entry is applied here, as the other extraction applies it.
      if (got.root) {
        chmodSync(staging.tree, (got.root.mode & 0o777 & ~process.umask()) | 0o700);
        utimesSync(staging.tree, got.root.mtime, got.root.mtime);
      }
      await staging.place(got.artifact_type, walked.top);
    } catch {
      return null;
    }
    return { artifact_type: got.artifact_type, bytes: got.bytes, entries: got.entries - got.fifos };
  } finally {
    pack?.stop();
    await staging.discard();
  }
}

/** Relays the reader's archive into GNU tar extracting into `tree`; null unless both ran cleanly. */
async function extract(
  pack: PackedPath,
  tree: string,
  options: { max_bytes?: number; signal?: AbortSignal },
): Promise<(DirectExport & { fifos: number; root: TarCounter["root"] }) | null> {
  const child = spawn(
    "bwrap",
    [
      ...toolSandboxArgs({ unprivileged: true }),
      "--bind",
      tree,
      "/dst",
      "--chdir",
      "/dst",
      "--",
      "/bin/sh",
      "-c",
      // -i: read to the end (tar would stop at the end-of-archive blocks and close the
      // pipe on the relay's last write).
      `umask ${process.umask().toString(8).padStart(4, "0")} && exec tar -xif - -k --no-same-owner --no-same-permissions`,
      "pyro-extract",
    ],
    { stdio: ["pipe", "ignore", "pipe"] },
  );
  let stderr = "";
  child.stderr.on("data", (c: Buffer) => {
    if (stderr.length < 1024) stderr += c.toString("utf8");
  });
  const exited = new Promise<number | null>((resolve) => {
    child.on("error", () => resolve(null));
    child.on("close", (code) => resolve(code));
  });
  // The bounds of every host-side extraction, and no name the host could not walk.
  const counter = new TarCounter({
    ...UNTRUSTED_LIMITS,
    nameBytes: Math.min(UNTRUSTED_LIMITS.nameBytes, PATH_MAX - Buffer.byteLength(tree) - 2),
  });
  const count = new Transform({
    transform(chunk: Buffer, _enc, done) {
      try {
        counter.push(chunk);
      } catch (err) {
        return done(err as Error);
      }
      if (options.max_bytes !== undefined && counter.bytes > options.max_bytes)
        return done(new Error("over the archive budget"));
      done(null, chunk);
    },
  });
  // On a failure the pipeline closes both ends: GNU tar reads the end of its input and
  // exits, the reader's next write fails and it exits. Neither is killed: a bwrap
  // killed while it sets up its sandbox leaves the sandbox's first process waiting for
  // it forever, holding the pipes (tests/escape/export-extract.test.ts).
  const relayed = await pipeline(
    pack.stream,
    count,
    child.stdin,
    options.signal ? { signal: options.signal } : {},
  )
    .then(() => true)
    .catch(() => false);
  if (!relayed) pack.stop();
  const [code, finished] = await Promise.all([exited, pack.finished]);
  if (options.signal?.aborted) throw new PyroError("cancelled", "the export was cancelled");
  if (!relayed || code !== 0 || stderr !== "" || !finished) return null;
  return {
    artifact_type: finished.artifact_type,
    bytes: counter.bytes,
    entries: counter.entries,
    fifos: counter.fifos,
    root: counter.root,
  };
}
