import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { closeSync, openSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import { PyroError } from "../../core/errors.js";
import { removeTree } from "../../util/mounts.js";
import type { OneShotResult, OneShotSpec } from "../backend.js";
import { CgroupLimits, detectCgroups } from "./cgroups.js";
import { isolationArgs, type LaunchTools, launchArgv } from "./launch.js";
import { writeSeccompFile } from "./seccomp.js";

/**
 * A one-shot command in a throwaway bwrap sandbox with the same isolation as a workspace
 * (copy-on-write root, namespaces, no capabilities, seccomp, cgroup limits), but no
 * guest agent: the command is bwrap's child, so `pyro run` costs one sandbox spawn.
 */
export async function bwrapRunOnce(spec: OneShotSpec, tools: LaunchTools): Promise<OneShotResult> {
  if (process.getuid?.() !== 0) {
    throw new PyroError(
      "backend_unavailable",
      "the bwrap backend needs root here (overlay mounts and cgroups)",
    );
  }
  const id = `run_${randomBytes(6).toString("hex")}`;
  const dir = join(spec.scratchDir, id);
  const upper = join(dir, "upper");
  const work = join(dir, "work");
  const merged = join(dir, "merged");
  await Promise.all([upper, work, merged].map((d) => mkdir(d, { recursive: true, mode: 0o700 })));
  const seccomp = join(dir, "seccomp.bpf");
  await writeSeccompFile(seccomp);
  const cgroups = await CgroupLimits.create(await detectCgroups(), id, {
    vcpus: spec.limits.vcpus,
    memoryMib: spec.limits.memory_mib,
    pidsMax: spec.limits.pids_max,
  }).catch(async (err: Error) => {
    await removeTree(dir);
    throw new PyroError(
      "backend_unavailable",
      `cannot apply resource limits: ${err.message}`,
      "pyro refuses to run without limits",
    );
  });
  const bwrap = [
    "bwrap",
    "--bind",
    merged,
    "/",
    ...isolationArgs(`pyro-${id.slice(4)}`, spec.env),
    "--dir",
    "/workspace",
    "--chdir",
    "/workspace",
    "--",
    "/bin/sh",
    "-c",
    spec.command,
  ];
  const argv = launchArgv([{ lower: spec.rootfs, upper, work, target: merged }], bwrap, tools);
  const started = performance.now();
  const fd = openSync(seccomp, "r");
  try {
    return await new Promise<OneShotResult>((resolve, reject) => {
      const child = spawn(argv[0]!, argv.slice(1), { stdio: ["pipe", "pipe", "pipe", fd] });
      const out = new Capture(spec.maxOutputBytes);
      const err = new Capture(spec.maxOutputBytes);
      child.stdout!.on("data", (c: Buffer) => out.push(c));
      child.stderr!.on("data", (c: Buffer) => err.push(c));
      let timedOut = false;
      const killAll = () => {
        cgroups.destroy().catch(() => child.kill("SIGKILL"));
      };
      const timer = setTimeout(() => {
        timedOut = true;
        killAll();
      }, spec.timeoutMs);
      const onAbort = () => killAll();
      spec.signal?.addEventListener("abort", onAbort, { once: true });
      child.on("error", (e) => {
        clearTimeout(timer);
        reject(new PyroError("backend_unavailable", `cannot start bwrap: ${e.message}`));
      });
      child.on("close", (code, signal) => {
        clearTimeout(timer);
        spec.signal?.removeEventListener("abort", onAbort);
        const exit = code ?? 128 + signalNumber(signal);
        resolve({
          exit_code: timedOut ? 124 : exit,
          stdout: out.text(),
          stderr: err.text(),
          duration_ms: Math.round(performance.now() - started),
          timed_out: timedOut,
          truncated: out.truncated || err.truncated,
        });
      });
      cgroups
        .addProcess(child.pid!)
        .then(() => child.stdin!.end("go\n"))
        .catch((e: Error) => {
          child.kill("SIGKILL");
          reject(
            new PyroError("backend_unavailable", `cannot place the sandbox in its cgroup: ${e.message}`),
          );
        });
    });
  } finally {
    closeSync(fd);
    await cgroups.destroy().catch(() => {});
    await removeTree(dir);
  }
}

/** Keeps the first `max` bytes of a stream and remembers whether more came. */
export class Capture {
  private readonly chunks: Buffer[] = [];
  private size = 0;
  truncated = false;
  constructor(private readonly max: number) {}
  push(c: Buffer): void {
    if (this.size >= this.max) {
      this.truncated = true;
      return;
    }
    const room = this.max - this.size;
    if (c.length > room) this.truncated = true;
    const kept = c.subarray(0, room);
    this.chunks.push(kept);
    this.size += kept.length;
  }
  text(): string {
    return Buffer.concat(this.chunks).toString("utf8");
  }
}

export function signalNumber(signal: NodeJS.Signals | null): number {
  const table: Partial<Record<NodeJS.Signals, number>> = {
    SIGKILL: 9,
    SIGTERM: 15,
    SIGINT: 2,
    SIGSEGV: 11,
    SIGABRT: 6,
  };
  return signal ? (table[signal] ?? 1) : 1;
}
