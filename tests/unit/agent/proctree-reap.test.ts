import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { afterEach, describe, expect, it } from "vitest";
import { untilReaped } from "../../../src/agent/guest/proctree.js";

/**
 * A stand-in for the command starter: a process with one child that has exited, which
 * it collects only when told (a line on its stdin), as a busy helper collects late.
 */
const REAPER = `
import os, sys
pid = os.fork()
if pid == 0:
    os._exit(0)
print(pid, flush=True)
sys.stdin.readline()
os.waitpid(pid, 0)
print("reaped", flush=True)
sys.stdin.readline()
`;

const running: ChildProcessWithoutNullStreams[] = [];
afterEach(() => {
  for (const p of running.splice(0)) p.kill("SIGKILL");
});

const stateOf = (pid: number) => readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.[0];

async function reaperWithZombie() {
  const p = spawn("python3", ["-c", REAPER]);
  running.push(p);
  const lines = createInterface({ input: p.stdout })[Symbol.asyncIterator]();
  const zombie = Number((await lines.next()).value);
  // The child is a zombie once the kernel has it exited; wait for that, not for a time.
  while (stateOf(zombie) !== "Z") await new Promise((r) => setTimeout(r, 5));
  return { p, zombie, lines };
}

const pending = async (promise: Promise<unknown>) =>
  Promise.race([promise.then(() => "settled"), new Promise((r) => setTimeout(() => r("pending"), 300))]);

describe("untilReaped", () => {
  it("waits while the reaper has not collected the dead, and returns once it has", async () => {
    const { p, zombie, lines } = await reaperWithZombie();
    const waiting = untilReaped([zombie], p.pid);
    expect(await pending(waiting)).toBe("pending");
    p.stdin.write("\n");
    expect((await lines.next()).value).toBe("reaped");
    await waiting;
    expect(await pending(waiting)).toBe("settled");
  });

  it("does not wait for a reaper that cannot collect (stopped), nor without one", async () => {
    const { p, zombie } = await reaperWithZombie();
    expect(await pending(untilReaped([zombie], undefined))).toBe("settled");
    process.kill(p.pid!, "SIGSTOP");
    while (stateOf(p.pid!) !== "T") await new Promise((r) => setTimeout(r, 5));
    expect(await pending(untilReaped([zombie], p.pid))).toBe("settled");
  });

  it("does not wait for live processes or someone else's zombies", async () => {
    const { zombie } = await reaperWithZombie();
    // process.pid is alive; the zombie's parent is not this "reaper".
    expect(await pending(untilReaped([process.pid, zombie], process.pid))).toBe("settled");
  });
});
