/**
 * GNU tar on a running bwrap workspace's /workspace, from the host but without its agent
 * (the fast export, pack.ts, and push, unpack.ts). The sandbox it runs in sees nothing of
 * the host: every namespace unshared, no capabilities, no environment, no /proc or /dev;
 * the workspace's tree at /workspace (read-only for a read) and GNU tar with its loader
 * and libraries at /run/tar, started through the loader, and nothing else. So whatever
 * the workspace does meanwhile (a directory swapped for a symlink to `/usr` or `/etc`),
 * a path leads into the workspace's own tree, to tar's own files, or nowhere; and the
 * workspace cannot reach the process (another pid namespace).
 *
 * The overlay is mounted in the sandbox's launch step's mount namespace: the sandbox is
 * made there, entered through a descriptor opened before the launch step is checked
 * again, so a recycled pid cannot send it elsewhere.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { closeSync, openSync } from "node:fs";
import { basename } from "node:path";
import { findGnuTar } from "../../agent/tarsafe.js";
import { run } from "../../util/run.js";
import { sameProcessAlive } from "../common.js";
import { sandboxLayout } from "../linux/layout.js";
import { ISOLATED } from "../linux/tool-sandbox.js";

/** Where the sandbox has GNU tar: the program, its loader and its libraries. */
const TOOLS = "/run/tar";

/** GNU tar and what it loads, as bwrap binds into {@link TOOLS}; null without GNU tar. */
let tarFiles: Promise<{ binds: string[]; argv: string[] } | null> | undefined;

function sandboxTar(): Promise<{ binds: string[]; argv: string[] } | null> {
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
 * Starts GNU tar with `args` in /workspace/`cwd` of the sandbox whose directory is `dir`
 * and launch step `launch` (stdout and stderr piped); null when GNU tar or the launch
 * step is missing. The caller ends it by closing its pipes, never by a kill: a bwrap
 * killed while it sets up its sandbox leaves the sandbox's first process waiting for it
 * forever.
 */
export async function spawnTreeTar(
  dir: string,
  launch: { pid: number; start_time: string },
  what: { workspace: "read-only" | "writable"; cwd: string; args: string[]; stdin: "pipe" | "ignore" },
): Promise<ChildProcess | null> {
  const tar = await sandboxTar();
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
      ...ISOLATED,
      what.workspace === "read-only" ? "--ro-bind" : "--bind",
      sandboxLayout(dir).wsMerged,
      "/workspace",
      ...tar.binds,
      "--chdir",
      what.cwd === "" ? "/workspace" : `/workspace/${what.cwd}`,
      "--",
      ...tar.argv,
      ...what.args,
    ];
    return spawn("nsenter", argv, { stdio: [what.stdin, "pipe", "pipe", ns] });
  } finally {
    closeSync(ns);
  }
}
