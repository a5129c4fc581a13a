import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { afterEach, describe, expect, it } from "vitest";
import { untilReaped } from "../../../src/agent/guest/reaping.js";

/**
 * A stand-in for the command starter: a process with one child that has exited, which
 * it collects only when told (a line on its stdin), as a busy helper collects late.
 */
const LATE_REAPER = `
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

/** A starter that collects every child as it dies, whose child sleeps until killed. */
const EAGER_REAPER = `
import os, time
pid = os.fork()
if pid == 0:
    time.sleep(100000)
    os._exit(0)
print(pid, flush=True)
while True:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        time.sleep(0.01)
`;

/** Seizes a pid with ptrace and never waits for it: its zombie is this tracer's alone. */
const TRACER = `
import ctypes, sys, time
print(ctypes.CDLL(None).ptrace(0x4206, int(sys.argv[1]), 0, 0), flush=True)
time.sleep(100000)
`;

const running: ChildProcessWithoutNullStreams[] = [];
afterEach(() => {
  for (const p of running.splice(0)) p.kill("SIGKILL");
});

const stateOf = (pid: number) => readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.[0];
const until = async (ok: () => boolean) => {
  while (!ok()) await new Promise((r) => setTimeout(r, 5));
};

function python(script: string, ...args: string[]) {
  const p = spawn("python3", ["-c", script, ...args]);
  running.push(p);
  const lines = createInterface({ input: p.stdout })[Symbol.asyncIterator]();
  return { p, next: async () => (await lines.next()).value as string };
}

async function reaperWithZombie() {
  const r = python(LATE_REAPER);
  const zombie = Number(await r.next());
  // The child is a zombie once the kernel has it exited; wait for that, not for a time.
  await until(() => stateOf(zombie) === "Z");
  return { ...r, zombie };
}

const pending = async (promise: Promise<unknown>, ms = 300) =>
  Promise.race([promise.then(() => "settled"), new Promise((r) => setTimeout(() => r("pending"), ms))]);

describe("untilReaped", () => {
  it("waits while the command starter has not collected its dead, and returns once it has", async () => {
    const { p, next } = await reaperWithZombie();
    const waiting = untilReaped(p.pid);
    expect(await pending(waiting)).toBe("pending");
    p.stdin.write("\n");
    expect(await next()).toBe("reaped");
    expect(await pending(waiting, 2000)).toBe("settled");
  });

  it("does not wait for a starter that cannot collect (stopped), nor without one", async () => {
    const { p } = await reaperWithZombie();
    expect(await pending(untilReaped(undefined))).toBe("settled");
    process.kill(p.pid!, "SIGSTOP");
    await until(() => stateOf(p.pid!) === "T");
    expect(await pending(untilReaped(p.pid))).toBe("settled");
  });

  it("waits no longer than its bound for a starter that does not collect", async () => {
    const { p } = await reaperWithZombie();
    expect(await pending(untilReaped(p.pid, 200), 2000)).toBe("settled");
  });

  it("does not wait for a zombie a tracer holds (its parent cannot collect it)", async () => {
    const r = python(EAGER_REAPER);
    const child = Number(await r.next());
    const tracer = python(TRACER, String(child));
    expect(await tracer.next()).toBe("0");
    process.kill(child, "SIGKILL");
    await until(() => stateOf(child) === "Z");
    expect(stateOf(r.p.pid!)).toBe("S");
    expect(await pending(untilReaped(r.p.pid), 2000)).toBe("settled");
  });
});
