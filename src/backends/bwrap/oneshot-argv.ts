import { createHash, randomBytes } from "node:crypto";
import { mkdir, rename, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { sandboxHostname } from "../guest.js";
import { isolationArgs } from "./isolation.js";
import { buildSeccompProgram } from "./seccomp.js";

/**
 * bwrap's argv of a one-shot up to its command: the merged root, the isolation flags of
 * every pyro sandbox (isolation.ts) and /workspace as the working directory. `env` lands
 * after `--clearenv`; a prepared launch passes it later, through `--args`.
 *
 * `--die-with-parent`: a one-shot's command lives no longer than what runs it. On the cold
 * path bwrap's parent is the owner itself (the launch step execs bwrap), so an owner
 * killed mid-run (whose timer can no longer fire) takes the command with it instead of
 * leaving it running past its timeout; what it leaves on disk is swept
 * (linux/oneshot-sweep.ts). A prepared launch's step is bwrap's parent there.
 */
export function bwrapPrefix(merged: string, id: string, env: Record<string, string> = {}): string[] {
  return [
    "bwrap",
    "--die-with-parent",
    "--bind",
    merged,
    "/",
    ...isolationArgs(sandboxHostname(id), env),
    "--dir",
    "/workspace",
    "--chdir",
    "/workspace",
  ];
}

const seccompFiles = new Map<string, Promise<string>>();

/**
 * The seccomp program's file in the runtime cache, written once per process and cache
 * (atomically, named by its content's hash: another version of pyro writes its own),
 * instead of once per run.
 */
export function seccompFile(runtimeCacheDir: string): Promise<string> {
  let p = seccompFiles.get(runtimeCacheDir);
  if (!p) {
    p = (async () => {
      // On another architecture every syscall would hit the KILL_PROCESS arch check.
      if (process.arch !== "x64")
        throw new Error(`the seccomp filter is x86_64-only; this host is ${process.arch}`);
      const program = buildSeccompProgram();
      const hash = createHash("sha256").update(program).digest("hex").slice(0, 16);
      await mkdir(runtimeCacheDir, { recursive: true, mode: 0o700 });
      const path = join(runtimeCacheDir, `seccomp-${hash}.bpf`);
      const partial = `${path}.${process.pid}.${randomBytes(4).toString("hex")}`;
      await writeFile(partial, program, { mode: 0o600 });
      await rename(partial, path);
      return path;
    })();
    p.catch(() => seccompFiles.delete(runtimeCacheDir));
    seccompFiles.set(runtimeCacheDir, p);
  }
  return p;
}
