/**
 * The process side of a qemu start: spawning QEMU, watching the boot, reading the
 * guest's console.
 */
import { closeSync, openSync } from "node:fs";
import { readFile, rm, writeFile } from "node:fs/promises";
import { setTimeout as sleep } from "node:timers/promises";
import { PyroError } from "../../errors.js";
import { killAndWait, logTail, procStartTime, sameProcessAlive, spawnDetached } from "../common.js";
import { qmpSocket } from "./machine.js";
import { QmpClient } from "./qmp.js";

/** What the guest's console printed, read (and consumed) from QEMU's ring over QMP. */
export async function consoleRead(sockets: string): Promise<string> {
  try {
    const qmp = await QmpClient.connect(qmpSocket(sockets), 1000);
    try {
      return await qmp.consoleRead();
    } finally {
      qmp.close();
    }
  } catch {
    return "(QEMU is gone)";
  }
}

/** Restarts of the guest agent during a boot that end the wait (stage 2 restarts it every second). */
const AGENT_RESTARTS_MAX = 3;
const BOOT_WATCH_MS = 1000;

/**
 * Waits for `work` (the guest's agent answering) while watching the VM, so a boot that
 * cannot succeed fails at once with the console's words instead of waiting out the
 * boot timeout (minutes for a cold boot under emulation): QEMU gone, or the guest agent
 * exiting again and again (stage 2 prints "pyro-init: ... exited N, restarting").
 * `w.console.text` collects what the console printed meanwhile.
 */
export async function watchBoot<T>(
  work: Promise<T>,
  w: { sockets: string; pid: number; startTime: string; log: string; console: { text: string } },
): Promise<T> {
  let done = false;
  let qmp: QmpClient | null = null;
  const watcher = (async (): Promise<never> => {
    qmp = await QmpClient.connect(qmpSocket(w.sockets), 5000).catch(() => null);
    if (done) qmp?.close();
    try {
      for (;;) {
        await sleep(BOOT_WATCH_MS);
        if (done) return new Promise<never>(() => {});
        if (!(await sameProcessAlive(w.pid, w.startTime)))
          throw new PyroError("backend_unavailable", `QEMU exited during the boot: ${await logTail(w.log)}`);
        if (qmp) w.console.text = `${w.console.text}${await qmp.consoleRead()}`.slice(-65536);
        const restarts = w.console.text.match(/pyro-init: .* exited \d+, restarting/g)?.length ?? 0;
        if (restarts >= AGENT_RESTARTS_MAX)
          throw new PyroError(
            "backend_unavailable",
            `the guest agent exited ${restarts} times during the boot`,
            "the console below says why; rerun with PYRO_DEBUG=1",
          );
      }
    } finally {
      qmp?.close();
    }
  })();
  watcher.catch(() => {});
  try {
    return await Promise.race([work, watcher]);
  } finally {
    done = true;
    // Free QMP at once: the failure path reads the console through it next.
    (qmp as QmpClient | null)?.close();
  }
}

/**
 * Spawns QEMU detached, its log in the layout, and records its pid and start time at once
 * (a QEMU left by a starter that died is found by the next start or delete). A saved state
 * is handed over as an open file (fd 3), so QEMU needs to start no program to read it and
 * runs with spawning denied.
 */
export async function spawnQemu(
  argv: string[],
  l: { log: string; sockets: string; pidFile: string },
  incoming: string | undefined,
): Promise<{ pid: number; startTime: string | null }> {
  const stateFd = incoming ? openSync(incoming, "r") : null;
  let pid: number;
  try {
    pid = spawnDetached(argv, {
      logFile: l.log,
      cwd: l.sockets,
      ...(stateFd !== null ? { extraFds: [stateFd] } : {}),
    }).pid;
  } finally {
    if (stateFd !== null) closeSync(stateFd);
  }
  const startTime = await procStartTime(pid);
  if (startTime) await writeFile(l.pidFile, `${pid} ${startTime}\n`, { mode: 0o600 });
  return { pid, startTime };
}

/** Ends the QEMU recorded in `pidFile` if it still runs (pid and start time must match). */
export async function killRecorded(pidFile: string): Promise<void> {
  const [pid, startTime] = (await readFile(pidFile, "utf8").catch(() => "")).trim().split(" ");
  if (pid && startTime) await killAndWait(Number(pid), startTime);
  await rm(pidFile, { force: true });
}
