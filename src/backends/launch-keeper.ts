/**
 * What a backend keeps ready between one-shot runs for its owner (an Engine with its pool
 * on: the SDK's `pool` option, PYRO_POOL, `pyro mcp serve`): at most one prepared launch
 * per key (backend, environment, disk size), for at most MAX_KEYS keys, made in the
 * background after a run and taken by the next; plus the clean-up of used ones, which
 * `ready` and `close` wait for. Closing ends every kept launch (docs/backends.md
 * "Prepared one-shot launch").
 */
export interface Kept {
  /** Ends the launch if it was never used, and resolves once nothing of it is left. */
  close(): Promise<void>;
}

/** Keys (environments) kept at once: the most recently run on. */
const MAX_KEYS = 2;
/** Preparations failed in a row after which a key gets no more (the runs take the cold path). */
const MAX_FAILURES = 2;

export class LaunchKeeper {
  private readonly kept = new Map<string, Promise<Kept | null>>();
  private readonly background = new Set<Promise<unknown>>();
  private readonly failures = new Map<string, number>();
  private closed = false;
  /** The last preparation's failure (tests and diagnostics). */
  lastError: string | undefined;

  /** The launch kept for `key` (waiting for one being prepared), or null. Taken: used once. */
  async take<T extends Kept>(key: string): Promise<T | null> {
    const p = this.kept.get(key);
    if (!p) return null;
    this.kept.delete(key);
    return (await p) as T | null;
  }

  /** Prepares a launch for `key` in the background, unless one is kept or being made. */
  prepare(key: string, make: () => Promise<Kept>): void {
    if (this.closed || this.kept.has(key) || (this.failures.get(key) ?? 0) >= MAX_FAILURES) return;
    const p = make().then(
      (k) => {
        this.failures.delete(key);
        return k;
      },
      (err: Error) => {
        this.failures.set(key, (this.failures.get(key) ?? 0) + 1);
        this.lastError = err.message;
        return null;
      },
    );
    this.kept.set(key, p);
    this.track(p);
    for (const old of [...this.kept.keys()].slice(0, Math.max(0, this.kept.size - MAX_KEYS))) {
      const dropped = this.kept.get(old)!;
      this.kept.delete(old);
      this.track(dropped.then((k) => k?.close()));
    }
  }

  /** Work of a used launch (its clean-up) that `ready` and `close` wait for. */
  track(p: Promise<unknown>): void {
    const t: Promise<unknown> = p.catch(() => {}).finally(() => this.background.delete(t));
    this.background.add(t);
  }

  /** Resolves once nothing is being prepared or cleaned up. */
  async ready(): Promise<void> {
    while (this.background.size > 0) await Promise.allSettled([...this.background]);
  }

  /** Ends every kept launch and waits for every clean-up; prepares nothing after. */
  async close(): Promise<void> {
    this.closed = true;
    const all = [...this.kept.values()];
    this.kept.clear();
    await Promise.allSettled(all.map(async (p) => (await p)?.close()));
    await this.ready();
  }
}
