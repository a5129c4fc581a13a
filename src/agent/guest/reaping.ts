/**
 * Waiting for the command starter (spawner.ts, the subreaper of every command's orphans)
 * to collect what a call ended. A zombie keeps its pid, and its place in the sandbox's
 * pids limit, until it is collected: a call that answered as soon as a fork bomb's
 * members were dead could leave the next call without a pid to fork (seen on a busy
 * machine: 190 of them still counted right after a timed-out call).
 *
 * What is waited for is the starter's own zombie children at the moment the wait begins
 * (read from /proc, so also zombies nobody saw alive), and of those only the ones it can
 * collect now: a zombie whose other threads still run (its main thread exited alone) or
 * that a tracer holds is not collectable by its parent, and a command can make either.
 * The wait ends when they are collected, when the starter cannot collect (gone, a zombie
 * itself, stopped), or after REAP_WAIT_MS, a bound that only a hostile or starved starter
 * reaches: the call answers either way.
 */
import { readdirSync, readFileSync } from "node:fs";

/** The longest a call waits for its dead to be collected (see the module comment). */
export const REAP_WAIT_MS = 5_000;

function read(path: string): string | null {
  try {
    return readFileSync(path, "latin1");
  } catch {
    return null;
  }
}

/** The state letter of `pid` (R, S, D, T, t, Z...), null when it is gone. */
export function stateLetter(pid: number): string | null {
  const text = read(`/proc/${pid}/stat`);
  return text === null ? null : (text.slice(text.lastIndexOf(")") + 2)[0] ?? null);
}

/** Whether `pid` is a thread group whose main thread is a zombie while other threads run. */
export function liveThreadsBehind(pid: number): boolean {
  try {
    return readdirSync(`/proc/${pid}/task`).length > 1;
  } catch {
    return false;
  }
}

/** Whether zombie `pid` can be collected by its parent now: no thread left, no tracer. */
function collectable(pid: number): boolean {
  if (liveThreadsBehind(pid)) return false;
  const status = read(`/proc/${pid}/status`);
  return status !== null && /^TracerPid:\s*0$/m.test(status);
}

/** The zombie children of `reaper` (a single-threaded process) that it can collect now. */
function collectableZombies(reaper: number): Set<number> {
  const children = read(`/proc/${reaper}/task/${reaper}/children`) ?? "";
  const out = new Set<number>();
  for (const c of children.split(" ")) {
    const pid = Number(c);
    if (c !== "" && stateLetter(pid) === "Z" && collectable(pid)) out.add(pid);
  }
  return out;
}

/** See the module comment. Without a reaper (commands the agent started itself) nothing is waited for. */
export async function untilReaped(reaper: number | undefined, maxMs = REAP_WAIT_MS): Promise<void> {
  if (reaper === undefined) return;
  const deadline = performance.now() + maxMs;
  let left = collectableZombies(reaper);
  while (left.size > 0) {
    const state = stateLetter(reaper);
    if (state === null || "ZXTt".includes(state) || performance.now() > deadline) return;
    await new Promise((r) => setTimeout(r, 2));
    const now = collectableZombies(reaper);
    left = new Set([...left].filter((pid) => now.has(pid)));
  }
}
