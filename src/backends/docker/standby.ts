/**
 * The standby container of a docker workspace: a reset that hands the workspace over to a
 * container started ahead of time instead of starting one (issue 18). Profiled here, a
 * docker reset that restarts is ~95 ms tearing the old container down, ~25 ms creating the
 * new one and its volume, ~270 ms in the engine's start and ~100 ms of the agent's start
 * (CPU-bound node): only a container started before the reset gets it near the kill.
 *
 * A standby is what a restart would start, started earlier: a new container on the
 * environment's image (a fresh root layer), /workspace a new overlay volume on the same
 * snapshot with an empty upper directory, its own socket directory, the same limits, its
 * agent listening and idle. Nothing runs in it and nothing but pyro reaches it. The hand-out
 * pauses the old container (the engine's freezer: none of the workspace's processes runs
 * again) and records the standby as the workspace's container; the old one is then
 * removed with its volume and layer after the answer (and by the next standby, start,
 * stop or delete of the workspace if this process died first). What a reset discards is discarded exactly as by the restart: processes, the
 * root layer (/tmp, /dev/shm and /dev included), /workspace's changes, IPC objects (a new
 * IPC namespace), the socket directory's contents.
 *
 * The two containers alternate between two slots, each with its volume and directories
 * (slot a: the names a workspace always had, so older workspaces need nothing new); the
 * current slot is in the workspace's engine record (docker.json).
 *
 * A standby is made only by a process that reset the workspace before, after a short
 * unref'd timer: a CLI call that reset a workspace exits first and makes none (it would
 * outlive the call for nothing), a long-lived one (SDK, MCP server) has it ready for the
 * next reset. It is used only for a reset onto the snapshot, spec and image it was made
 * for; anything else (or a standby that died or was removed by another process) is removed
 * and the reset restarts as before.
 */
import { stat } from "node:fs/promises";
import { join } from "node:path";
import type Docker from "dockerode";
import type { SandboxSpec } from "../backend.js";
import { deadline, ignoreGone } from "./client.js";
import { LABELS, volumeName } from "./container.js";

export type Slot = "a" | "b";

export function otherSlot(slot: Slot): Slot {
  return slot === "a" ? "b" : "a";
}

/**
 * A slot's host paths: /workspace's upper and work directories (without a disk limit),
 * its disk image and the image's mount point (with one: upper and work are on it,
 * docker/disk-limit.ts), the socket directory and the filesystem it is on (a tmpfs with a
 * disk limit; the host's link directory beside it, common.ts hostLinkDir, must be on the
 * same one).
 */
export function slotPaths(dir: string, slot: Slot, limited = true) {
  const suffix = slot === "a" ? "" : "-b";
  const ws = join(dir, `ws${suffix}`);
  // Without a disk limit the socket directory stays where it always was: a kept
  // container's binds name it, and one whose binds differ is made again (its root layer lost).
  const sockFs = join(dir, limited ? `sockfs${suffix}` : `sock${suffix}`);
  return {
    ws,
    upper: join(ws, "upper"),
    work: join(ws, "work"),
    disk: { image: join(ws, "disk.img"), mount: join(ws, "disk") },
    sockFs,
    sock: limited ? join(sockFs, "sock") : sockFs,
  };
}

/** The /workspace volume of a slot. */
export function slotVolume(workspaceId: string, slot: Slot): string {
  return slot === "a" ? volumeName(workspaceId) : `${volumeName(workspaceId)}-b`;
}

/**
 * A slot's container name: slot a has the workspace's `pyro-<id>`, slot b `pyro-<id>-b`, so a
 * hand-out renames nothing (a rename is two engine calls of 20-40 ms here).
 */
export function slotName(base: string, slot: Slot): string {
  return slot === "a" ? base : `${base}-b`;
}

/** The workspace's base container name back from a slot's. */
export function baseName(container: string, slot: Slot): string {
  return slot === "b" && container.endsWith("-b") ? container.slice(0, -2) : container;
}

/** Delay before a standby is made: a CLI call has exited by then (the timer is unref'd). */
export const STANDBY_DELAY_MS = 300;

/** A standby being made or ready, in the process that makes it. */
export interface StandbyEntry<S> {
  /** What it was made for: the spec (snapshot, limits, directories) and the image. */
  key: string;
  slot: Slot;
  timer: NodeJS.Timeout | null;
  promise: Promise<S | null> | null;
  cancelled: boolean;
  /**
   * Starts making it now if the timer has not yet (a reset right after the last one: a
   * standby started now is still ready sooner than a restart, which also tears down).
   */
  start(): Promise<S | null>;
}

/** Pending and ready standbys of one backend instance, by the workspace's container name. */
export class StandbyTable<S> {
  private readonly entries = new Map<string, StandbyEntry<S>>();
  private readonly cleanups = new Map<string, Promise<void>>();

  /** Runs a hand-out's removal of the old slot after the answer (errors: the next standby's). */
  cleanup(container: string, work: Promise<void>): void {
    const p = work.catch(() => {});
    this.cleanups.set(container, p);
    void p.then(() => {
      if (this.cleanups.get(container) === p) this.cleanups.delete(container);
    });
  }

  /** Waits for a pending cleanup of `container`'s old slot. */
  async cleanedUp(container: string): Promise<void> {
    await this.cleanups.get(container);
  }

  /** Makes `make()` run after STANDBY_DELAY_MS unless dropped first; replaces any entry. */
  schedule(
    container: string,
    key: string,
    slot: Slot,
    make: (e: StandbyEntry<S>) => Promise<S | null>,
  ): void {
    const e: StandbyEntry<S> = {
      key,
      slot,
      timer: null,
      promise: null,
      cancelled: false,
      start: () => {
        if (e.promise) return e.promise;
        if (e.timer) clearTimeout(e.timer);
        e.timer = null;
        e.promise = make(e).catch(() => null);
        return e.promise;
      },
    };
    e.timer = setTimeout(() => void e.start(), STANDBY_DELAY_MS);
    e.timer.unref();
    this.entries.set(container, e);
  }

  /** Takes the entry out (the caller uses it or removes it). */
  take(container: string): StandbyEntry<S> | undefined {
    const e = this.entries.get(container);
    this.entries.delete(container);
    return e;
  }

  /** Cancels and forgets an entry, waiting for a standby being made to settle. */
  async drop(container: string): Promise<void> {
    const e = this.take(container);
    if (!e) return;
    e.cancelled = true;
    if (e.timer) clearTimeout(e.timer);
    await e.promise;
  }
}

/**
 * Stops every process of a container for good before the hand-out answers: paused (the
 * cgroup freezer: they never run again; the removal after the answer kills them), or,
 * where the engine cannot pause, removed at once.
 */
export async function retire(docker: Docker, id: string): Promise<void> {
  const c = docker.getContainer(id);
  try {
    await ignoreGone(c.pause(deadline()));
  } catch {
    await ignoreGone(c.remove({ force: true, ...deadline() }), [409]);
  }
}

/** Removes a volume if it is the workspace's (by its label). */
export async function removeVolume(docker: Docker, name: string, dir: string): Promise<void> {
  const v = await ignoreGone(docker.getVolume(name).inspect(deadline()));
  if (v && v.Labels?.[LABELS.dir] === dir) await ignoreGone(docker.getVolume(name).remove(deadline()));
}

/**
 * What a standby must have been made for to serve a reset: the same spec, image and
 * snapshot tree (its directory's identity: a snapshot deleted and made again under the
 * same name is another tree, which the standby's overlay would not show).
 */
export async function standbyKey(spec: SandboxSpec, image: string): Promise<string> {
  const st = await stat(join(spec.snapshotsDir, spec.snapshot), { bigint: true });
  return JSON.stringify([spec, image, String(st.ino), String(st.ctimeNs)]);
}
