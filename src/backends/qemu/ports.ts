import { randomBytes } from "node:crypto";
import { open, readFile, stat, unlink, writeFile } from "node:fs/promises";
import type { Socket } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { PyroError } from "../../errors.js";
import { connectUnix, procStartTime, sameProcessAlive } from "../common.js";
import { SERIAL_PORTS } from "../vm/types.js";
import { portSocket } from "./machine.js";

/**
 * A connection to the guest agent over one of the VM's virtio-serial ports. A port carries
 * one session at a time (QEMU's socket accepts one client; another would sit unanswered
 * in its backlog), so each connection takes a port by creating `p<N>.lock` exclusively;
 * the lock names its holder (pid + start time), and a lock whose holder died is taken
 * over. The lock is removed when the connection closes.
 *
 * A port just released is left alone for COOL_MS: the guest learns that its host hung
 * up only when it next reads the port, and a new client that connected before that
 * would have its handshake swallowed by the old session. Releasing touches
 * `p<N>.lock.cool`; takers skip a port whose cool file is younger than COOL_MS.
 */
const COOL_MS = 1000;

export async function connectPort(
  socketDir: string,
  timeoutMs: number,
  options: { fromLast?: boolean } = {},
): Promise<Socket> {
  const deadline = Date.now() + timeoutMs;
  const me = `${process.pid} ${await procStartTime(process.pid)} ${randomBytes(6).toString("hex")}`;
  for (;;) {
    for (let n = 0; n < SERIAL_PORTS; n++) {
      const i = options.fromLast ? SERIAL_PORTS - 1 - n : n;
      const lock = `${portSocket(socketDir, i)}.lock`;
      if (!(await takeLock(lock, me))) continue;
      let sock: Socket;
      try {
        sock = await connectUnix(portSocket(socketDir, i), Math.max(1000, deadline - Date.now()));
      } catch (err) {
        await releaseLock(lock, me);
        throw new PyroError(
          "backend_unavailable",
          `cannot reach the VM's agent port: ${(err as Error).message}`,
        );
      }
      sock.once("close", () => void releaseLock(lock, me));
      return sock;
    }
    if (Date.now() > deadline)
      throw new PyroError(
        "timeout",
        `all ${SERIAL_PORTS} agent channels of the VM are in use`,
        "close other pyro clients of this workspace",
      );
    await sleep(25);
  }
}

async function takeLock(path: string, me: string): Promise<boolean> {
  const cooled = await stat(`${path}.cool`).then(
    (st) => Date.now() - st.mtimeMs >= COOL_MS,
    () => true,
  );
  if (!cooled) return false;
  try {
    const fh = await open(path, "wx", 0o600);
    await fh.writeFile(me);
    await fh.close();
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
  }
  const holder = (await readFile(path, "utf8").catch(() => "")).split(" ");
  // A lock being written right now reads empty: treat as held.
  if (holder.length < 2 || (await sameProcessAlive(Number(holder[0]), holder[1]))) return false;
  // Its holder died: free the port, and let it cool like any released port.
  await writeFile(`${path}.cool`, "");
  await unlink(path).catch(() => {});
  return false;
}

async function releaseLock(path: string, me: string): Promise<void> {
  if ((await readFile(path, "utf8").catch(() => "")) !== me) return;
  await writeFile(`${path}.cool`, "").catch(() => {});
  await unlink(path).catch(() => {});
}
