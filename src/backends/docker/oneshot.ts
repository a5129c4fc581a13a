import { randomBytes } from "node:crypto";
import { rm } from "node:fs/promises";
import { join } from "node:path";
import type { Duplex } from "node:stream";
import type Docker from "dockerode";
import { HeadTailCapture } from "../../agent/capture.js";
import { PyroError } from "../../errors.js";
import type { OneShotResult, OneShotSpec } from "../backend.js";
import { oneShotResult } from "../gated-run.js";
import { CALL_MS, deadline, engineError, ignoreGone, withTimeout } from "./client.js";
import {
  hostnameFor,
  type InspectedHostConfig,
  type MountBody,
  oneShotContainerBody,
  unappliedSettings,
} from "./container.js";
import { etcBinds, requireDiskSupport, storageSize } from "./disk-limit.js";
import { ensureImage } from "./image.js";
import { limitExclusive } from "./qgroup.js";
import { StreamDemuxer } from "./stream.js";

/**
 * A one-shot's disk limit (it has no /workspace volume): the root layer's size, and
 * /etc's network files read-only in `dir` (disk-limit.ts etcBinds).
 */
async function oneShotDisk(
  docker: Docker,
  endpoint: string,
  image: string,
  spec: OneShotSpec,
  id: string,
  dir: string,
): Promise<{ storageSize: string; binds: MountBody[]; exclusive: boolean } | undefined> {
  const mib = spec.limits.disk_mib;
  if (mib === undefined) return undefined;
  const support = await requireDiskSupport(docker, endpoint);
  return {
    storageSize: await storageSize(docker, support, image, mib),
    binds: await etcBinds(dir, hostnameFor(id), true),
    exclusive: support.countsImage,
  };
}

/** After the command exits, how long its output may still take to arrive. */
const DRAIN_MS = 2000;

/**
 * `pyro run` on docker, like `docker run --rm`: a throwaway container with the same
 * isolation and limits as a workspace whose only process is the command (no agent).
 * Output is read through an attach made before the start, capped per stream (head and
 * tail, src/agent/capture.ts); the
 * timeout (or a cancel) kills the container, and it is always removed.
 */
export async function dockerRunOnce(
  docker: Docker,
  endpoint: string,
  spec: OneShotSpec,
): Promise<OneShotResult> {
  const image = await ensureImage(docker, endpoint, spec.rootfs, spec.signal ? { signal: spec.signal } : {});
  const id = `run_${randomBytes(6).toString("hex")}`;
  // A run directory's name: one the owner's kill leaves is swept (linux/oneshot-sweep.ts).
  const dir = join(spec.scratchDir, id);
  let container: Docker.Container | undefined;
  try {
    const disk = await oneShotDisk(docker, endpoint, image, spec, id, dir);
    const body = oneShotContainerBody({
      id,
      image,
      command: spec.command,
      env: spec.env,
      limits: spec.limits,
      stdin: spec.stdin !== undefined,
      ...(disk ?? {}),
    });
    container = await docker.createContainer({ ...body, ...deadline() } as Docker.ContainerCreateOptions);
    const inspected = await container.inspect(deadline());
    const problems = unappliedSettings(body.HostConfig, inspected.HostConfig as InspectedHostConfig);
    // On btrfs the limit also on what the command writes (qgroup.ts).
    if (
      problems.length === 0 &&
      disk?.exclusive &&
      spec.limits.disk_mib &&
      !(await limitExclusive(docker, inspected, spec.limits.disk_mib))
    )
      problems.push("the disk limit's exclusive qgroup limit could not be set (btrfs qgroup limit -e)");
    if (problems.length > 0) {
      throw new PyroError(
        "backend_unavailable",
        `the Docker engine did not apply pyro's isolation: ${problems.join("; ")}`,
        "pyro refuses to run without its limits",
      );
    }
    const attached = container.attach({
      stream: true,
      stdin: spec.stdin !== undefined,
      stdout: true,
      stderr: true,
      hijack: true,
    });
    const conn = (await withTimeout(attached, CALL_MS, (late) => (late as Duplex).destroy())) as Duplex;
    return await runAttached(container, conn, spec);
  } catch (err) {
    throw engineError(err, "pyro run on docker", endpoint);
  } finally {
    if (container) await ignoreGone(container.remove({ force: true, ...deadline() })).catch(() => {});
    await rm(dir, { recursive: true, force: true }).catch(() => {});
  }
}

async function runAttached(
  container: Docker.Container,
  conn: Duplex,
  spec: OneShotSpec,
): Promise<OneShotResult> {
  const out = new HeadTailCapture(spec.maxOutputBytes);
  const err = new HeadTailCapture(spec.maxOutputBytes);
  const demux = new StreamDemuxer();
  const drained = new Promise<void>((resolve) => {
    conn.on("data", (chunk: Buffer) => {
      try {
        // Copied: the capture keeps chunks, and a frame's data may be a view of the demuxer's buffer.
        for (const f of demux.push(chunk)) {
          const data = Buffer.from(f.data);
          (f.stream === 1 ? out : err).push(data);
          spec.onOutput?.(f.stream === 1 ? "stdout" : "stderr", data);
        }
      } catch {
        conn.destroy();
      }
    });
    conn.once("end", resolve);
    conn.once("close", resolve);
    conn.once("error", () => resolve());
  });

  let timedOut = false;
  const kill = () => {
    container.kill({ signal: "SIGKILL", ...deadline() }).catch(() => {});
  };
  const timer = setTimeout(() => {
    timedOut = true;
    kill();
  }, spec.timeoutMs);
  spec.signal?.addEventListener("abort", kill, { once: true });
  const started = performance.now();
  try {
    // wait() is registered before start() so even an instant exit is seen.
    const exited = container.wait({ condition: "next-exit", ...deadline(spec.timeoutMs + CALL_MS) });
    await container.start(deadline());
    // The command's stdin through the attach; ending our side closes it (StdinOnce).
    if (spec.stdin) void feed(conn, spec.stdin);
    const { StatusCode } = (await exited) as { StatusCode: number };
    const duration = Math.round(performance.now() - started);
    await Promise.race([drained, new Promise((r) => setTimeout(r, DRAIN_MS).unref())]);
    if (spec.signal?.aborted)
      throw new PyroError("cancelled", "the run was cancelled; its container was killed");
    return oneShotResult(out, err, { exitCode: StatusCode, timedOut, durationMs: duration });
  } finally {
    clearTimeout(timer);
    spec.signal?.removeEventListener("abort", kill);
    conn.destroy();
  }
}

/** Writes `stdin` into the attach connection, then half-closes it: the command's EOF. */
async function feed(conn: Duplex, stdin: NonNullable<OneShotSpec["stdin"]>): Promise<void> {
  try {
    for await (const chunk of stdin as AsyncIterable<Uint8Array | string>) {
      if (conn.destroyed) return;
      if (!conn.write(chunk)) await new Promise((r) => conn.once("drain", r));
    }
    conn.end();
  } catch {
    // The container is gone or the caller's stdin failed: the command sees EOF either way.
    if (!conn.destroyed) conn.end();
  }
}
