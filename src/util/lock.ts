import { randomBytes } from "node:crypto";
import { link, open, readFile, rename, rm } from "node:fs/promises";
import { hostname } from "node:os";
import { PyroError } from "../errors.js";
import { pidAlive } from "./fs.js";

export interface LockOptions {
  /** Give up after this long (default 45 min: a cold debootstrap on a busy host). */
  timeoutMs?: number;
  pollMs?: number;
  signal?: AbortSignal;
  /** Called once when the lock is held by someone else and we start waiting. */
  onWait?: (holder: LockOwner) => void;
}

export interface LockOwner {
  pid: number;
  host: string;
  started_at: string;
}

/**
 * An exclusive file lock built on O_EXCL create. The file names its owner; a lock whose
 * owner process is gone (same host, dead pid) is stale and taken over, so a killed
 * build never wedges the cache.
 */
export async function acquireLock(path: string, options: LockOptions = {}): Promise<() => Promise<void>> {
  const deadline = Date.now() + (options.timeoutMs ?? 45 * 60 * 1000);
  const pollMs = options.pollMs ?? 200;
  const me: LockOwner = { pid: process.pid, host: hostname(), started_at: new Date().toISOString() };
  let waited = false;
  for (;;) {
    try {
      const fh = await open(path, "wx", 0o644);
      await fh.writeFile(JSON.stringify(me));
      await fh.close();
      return async () => {
        // Only remove the lock if it is still ours.
        const owner = await readOwner(path);
        if (owner && owner !== "torn" && owner.pid === me.pid && owner.host === me.host)
          await rm(path, { force: true });
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    }
    const owner = await readOwner(path);
    if (owner === "torn" || (owner && owner.host === me.host && !pidAlive(owner.pid))) {
      await breakStaleLock(path, owner);
      continue;
    }
    if (owner && !waited) {
      waited = true;
      options.onWait?.(owner);
    }
    if (options.signal?.aborted) throw new PyroError("cancelled", "cancelled while waiting for a lock");
    if (Date.now() > deadline) {
      throw new PyroError(
        "timeout",
        `timed out waiting for lock ${path}`,
        "another pyro process is building; retry later",
      );
    }
    await new Promise((r) => setTimeout(r, pollMs));
  }
}

/**
 * Removes a lock whose owner died. The file is first renamed aside and re-read, so a
 * racing process that already replaced the stale lock with a live one keeps it (we put
 * it back); O_EXCL on the next attempt still lets exactly one process win.
 */
async function breakStaleLock(path: string, seen: LockOwner | "torn"): Promise<void> {
  const aside = `${path}.${process.pid}.${randomBytes(4).toString("hex")}.stale`;
  try {
    await rename(path, aside);
  } catch {
    return; // someone else moved it first
  }
  const moved = await readOwner(aside);
  const same =
    moved === seen ||
    (moved !== "torn" && seen !== "torn" && moved?.pid === seen.pid && moved?.host === seen.host);
  if (!same) {
    // We moved a live lock: restore it unless a third process has taken the path.
    await link(aside, path).catch(() => {});
  }
  await rm(aside, { force: true });
}

async function readOwner(path: string): Promise<LockOwner | "torn" | null> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch {
    return null;
  }
  try {
    const parsed = JSON.parse(text) as LockOwner;
    if (typeof parsed.pid === "number" && typeof parsed.host === "string") return parsed;
  } catch {
    // fall through
  }
  // A lock file younger than a second may be mid-write; treat as held.
  return text.length === 0 ? await youngOrTorn(path) : "torn";
}

async function youngOrTorn(path: string): Promise<LockOwner | "torn" | null> {
  const { stat } = await import("node:fs/promises");
  try {
    const st = await stat(path);
    if (Date.now() - st.mtimeMs < 1000) return { pid: -1, host: "?", started_at: "" };
    return "torn";
  } catch {
    return null;
  }
}
