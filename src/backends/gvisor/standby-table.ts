/**
 * The standbys one gVisor backend instance makes or holds (standby.ts), by workspace id:
 * at most one per workspace, made after a timer, taken by the next reset, ended by a stop,
 * a start or a delete of the workspace.
 */
import type { ChildProcess } from "node:child_process";
import { mkdir } from "node:fs/promises";
import type { SandboxSpec } from "../backend.js";
import { detectCgroups } from "../linux/cgroups.js";
import {
  endAllStandbys,
  endStandby,
  newToken,
  STANDBY_DELAY_MS,
  standbyKey,
  standbyNames,
  startWatchdog,
  stopWatchdog,
} from "./standby.js";

interface Entry<S> {
  spec: SandboxSpec;
  /** What it was made for (standby.ts standbyKey). */
  key: string;
  token: string;
  timer: NodeJS.Timeout | null;
  promise: Promise<S | null> | null;
  cancelled: boolean;
  /** The watchdog that reaps the standby if this process ends first (standby.ts). */
  watchdog: ChildProcess | null;
}

/** Starts a sandbox of `spec` (in `spec.dir`) under cgroup `cg`; the backend's launch. */
export type Launch<S> = (spec: SandboxSpec, cg: string) => Promise<S>;

export class GvisorStandbys<S> {
  private readonly entries = new Map<string, Entry<S>>();
  /** Workspaces whose next start is followed by a standby: this process reset them. */
  private readonly wanted = new Set<string>();
  /** A hand-out's removal of the old sandbox's leftovers, by workspace id. */
  private readonly cleanups = new Map<string, Promise<void>>();

  constructor(private readonly launch: Launch<S>) {}

  /** Marks the workspace for a standby after its next start (a reset that restarts). */
  want(id: string): void {
    this.wanted.add(id);
  }

  /** Schedules a standby if the workspace was marked. */
  async afterStart(spec: SandboxSpec): Promise<void> {
    if (this.wanted.delete(spec.workspace_id)) await this.schedule(spec).catch(() => {});
  }

  /** A standby for the next reset of `spec`'s workspace, made after STANDBY_DELAY_MS. */
  async schedule(spec: SandboxSpec): Promise<void> {
    const e: Entry<S> = {
      spec,
      key: await standbyKey(spec),
      token: newToken(),
      timer: null,
      promise: null,
      cancelled: false,
      watchdog: null,
    };
    e.timer = setTimeout(() => void this.start(e), STANDBY_DELAY_MS);
    e.timer.unref();
    await this.drop(spec.workspace_id);
    this.entries.set(spec.workspace_id, e);
  }

  /** Starts making it now if the timer has not yet; the standby, or null when it failed. */
  private start(e: Entry<S>): Promise<S | null> {
    if (e.promise) return e.promise;
    if (e.timer) clearTimeout(e.timer);
    e.timer = null;
    e.promise = this.make(e).catch(() => null);
    return e.promise;
  }

  /** Starts a standby (its watchdog first); one cancelled meanwhile is ended again. */
  private async make(e: Entry<S>): Promise<S | null> {
    const n = standbyNames(e.spec, e.token);
    await mkdir(n.dir, { recursive: true, mode: 0o700 });
    e.watchdog = await startWatchdog(e.spec.appDir, e.spec, e.token);
    if (e.cancelled) return null;
    const state = await this.launch({ ...e.spec, dir: n.dir }, n.cgroup);
    if (e.cancelled) {
      await endStandby(await detectCgroups(), e.spec, e.token);
      return null;
    }
    return state;
  }

  /**
   * The standby for a reset onto `spec`, taken out of the table (waiting for one being
   * made), with its watchdog ended: from then on it is the caller's. Null when there is
   * none made for exactly this spec (one that does not fit is ended).
   */
  async take(spec: SandboxSpec): Promise<{ standby: S; token: string } | null> {
    const e = this.entries.get(spec.workspace_id);
    this.entries.delete(spec.workspace_id);
    if (!e) return null;
    const fits = e.key === (await standbyKey(spec).catch(() => null));
    const standby = fits ? await this.start(e) : null;
    if (!standby) {
      await this.end(e);
      return null;
    }
    stopWatchdog(e.watchdog);
    return { standby, token: e.token };
  }

  /** Ends this process's standby of a workspace (made, being made or scheduled). */
  async drop(id: string): Promise<void> {
    const e = this.entries.get(id);
    this.entries.delete(id);
    if (e) await this.end(e);
  }

  private async end(e: Entry<S>): Promise<void> {
    e.cancelled = true;
    if (e.timer) clearTimeout(e.timer);
    e.timer = null;
    await e.promise;
    stopWatchdog(e.watchdog);
    await endStandby(await detectCgroups(), e.spec, e.token);
  }

  /** Ends every standby of the workspace (any process's), after this process's hand-out cleanup. */
  async endAll(spec: { dir: string; workspace_id: string }): Promise<void> {
    await this.drop(spec.workspace_id);
    await this.cleanups.get(spec.workspace_id);
    await endAllStandbys(await detectCgroups(), spec);
  }

  /** Runs a hand-out's removal of the old sandbox after the answer (errors: the next start's). */
  cleanup(id: string, work: Promise<void>): void {
    const p = work.catch(() => {});
    this.cleanups.set(id, p);
    void p.then(() => {
      if (this.cleanups.get(id) === p) this.cleanups.delete(id);
    });
  }
}
