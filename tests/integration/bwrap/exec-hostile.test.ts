import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bwrapSkipReason, type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";

/**
 * Commands that try to hold their exec call, or the next one, past its timeout: each call
 * must answer as the agent's own (`timed_out`, or the command's exit), never as the
 * host's request timeout (EXEC_SLACK_MS past the exec's, "the agent may be hung"). Found
 * by an adversarial review of the agent's kill and reap (agent/guest/proctree.ts,
 * reaping.ts, spawner.ts); each case held its call until the host gave up before the fix.
 * Every case has a workspace of its own: what it leaves running stays there.
 */
const skip = bwrapSkipReason();

/** Seizes a pid with ptrace and never waits for it: its zombie is visible only to this tracer. */
const NO_WAIT_TRACER = `
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
r = libc.ptrace(0x4206, int(sys.argv[1]), 0, 0)
print("seized", r, ctypes.get_errno(), flush=True)
time.sleep(100000)
`;

/**
 * Seizes a pid, suppresses its stops and its first SIGHUP, lets a later SIGHUP kill it,
 * then never waits again.
 */
const HUP_TRACER = `
import ctypes, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
m = int(sys.argv[1])
print("seized", libc.ptrace(0x4206, m, 0, 0), flush=True)
hups = 0
while True:
    pid, st = os.waitpid(m, 0x40000000)
    if not os.WIFSTOPPED(st):
        break
    sig = os.WSTOPSIG(st)
    if sig == signal.SIGHUP and (st >> 16) == 0:
        hups += 1
        if hups >= 2:
            libc.ptrace(7, m, 0, signal.SIGHUP)
            print("delivered", flush=True)
            break
    libc.ptrace(7, m, 0, 0)
time.sleep(100000)
`;

/** The main thread exits alone; another thread lives on: the leader shows as a zombie. */
const LEADER_EXIT = `
import ctypes, threading, time
threading.Thread(target=lambda: time.sleep(100000)).start()
time.sleep(0.2)
ctypes.CDLL(None).syscall(60, 0)
`;

/** Outside the tree (no marker, own session, orphaned), it starts marker-carrying sleeps. */
const MARKER_SPAWNER = `
import os, signal, sys, threading
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
env = dict(os.environ, PYRO_EXEC_TOKEN=sys.argv[1])
def spawn():
    while True:
        try:
            os.posix_spawn("/bin/sleep", ["sleep", "1000"], env)
        except OSError:
            pass
for _ in range(3):
    threading.Thread(target=spawn).start()
`;

/** Catches SIGHUP; 30 ms after the first, its main thread exits alone (another thread lives on). */
const HUP_LEADER_EXIT = `
import ctypes, signal, threading, time
first = []
signal.signal(signal.SIGHUP, lambda *a: first or first.append(time.monotonic()))
threading.Thread(target=lambda: time.sleep(100000), daemon=True).start()
while not first or time.monotonic() - first[0] < 0.03:
    time.sleep(0.001)
ctypes.CDLL(None).syscall(60, 0)
`;

/** Seizes and interrupts the command starter for argv[1] seconds, then ends (which detaches it). */
const BRIEF_TRACER = `
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
h = [int(p) for p in os.listdir("/proc") if p.isdigit() and b"pyro-spawn" in open(f"/proc/{p}/cmdline", "rb").read()][0]
print(libc.ptrace(0x4206, h, 0, 0), libc.ptrace(0x4207, h, 0, 0), flush=True)
time.sleep(float(sys.argv[1]))
`;

const q = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

describe.skipIf(skip !== "")(suiteTitle("exec calls a command tries to hold, on bwrap", skip), () => {
  let h: Harness;

  beforeAll(async () => {
    h = await openHarness("exec-hostile");
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  async function workspaceWith(file: string, script: string): Promise<string> {
    const id = (await h.create()).workspace_id;
    await h.pyro.execWorkspace(id, `printf %s ${q(script)} > ${file}`);
    return id;
  }

  it("times out a command whose killed orphan a process outside the tree traces and never waits for", async () => {
    const id = await workspaceWith("/tmp/tracer.py", NO_WAIT_TRACER);
    const cmd = [
      "( sleep 1000 & echo $! > /tmp/m.pid )",
      "( setsid env -u PYRO_EXEC_TOKEN python3 /tmp/tracer.py $(cat /tmp/m.pid) > /tmp/tr.log 2>&1 & )",
      "sleep 100",
    ].join("\n");
    const r = await h.pyro.execWorkspace(id, cmd, { timeoutSeconds: 3 });
    expect(r.timed_out).toBe(true);
  });

  it("times out a command whose own shell such a tracer holds (its exit never comes)", async () => {
    const id = await workspaceWith("/tmp/tracer.py", NO_WAIT_TRACER);
    const cmd = "( setsid env -u PYRO_EXEC_TOKEN python3 /tmp/tracer.py $$ > /tmp/tr.log 2>&1 & ); sleep 100";
    const r = await h.pyro.execWorkspace(id, cmd, { timeoutSeconds: 3 });
    expect(r.timed_out).toBe(true);
    const next = await h.pyro.execWorkspace(id, "echo next", { timeoutSeconds: 20 });
    expect(next.stdout).toBe("next\n");
  });

  it("lets another call's command finish while a command briefly traces the command starter", async () => {
    const id = await workspaceWith("/tmp/tracer.py", BRIEF_TRACER);
    const build = h.pyro.execWorkspace(id, "sleep 4; echo built", { timeoutSeconds: 30 });
    // The tracer runs while the first call's command sleeps (started after it, on the same agent).
    await h.pyro.execWorkspace(id, "python3 /tmp/tracer.py 2", { timeoutSeconds: 30 });
    expect((await build).stdout).toBe("built\n");
  });

  it("starts a command itself while a tracer holds the command starter", async () => {
    const id = await workspaceWith("/tmp/tracer.py", BRIEF_TRACER);
    // This call's own exit is the held starter's to report: it answers at its timeout.
    const hold = [
      "( setsid env -u PYRO_EXEC_TOKEN python3 /tmp/tracer.py 120 > /tmp/tr.log 2>&1 & )",
      "until [ -s /tmp/tr.log ]; do sleep 0.05; done",
    ].join("\n");
    expect((await h.pyro.execWorkspace(id, hold, { timeoutSeconds: 3 })).timed_out).toBe(true);
    const r = await h.pyro.execWorkspace(id, "echo started", { timeoutSeconds: 20 });
    expect([r.timed_out, r.stdout]).toEqual([false, "started\n"]);
  });

  it("answers a command whose hung-up job such a tracer holds", async () => {
    const id = await workspaceWith("/tmp/tracer.py", HUP_TRACER);
    const cmd = [
      "sleep 1000 & echo $! > /tmp/m.pid",
      "setsid env -u PYRO_EXEC_TOKEN python3 /tmp/tracer.py $! > /tmp/tr.log 2>&1 &",
      "sleep 0.5",
    ].join("\n");
    const r = await h.pyro.execWorkspace(id, cmd, { timeoutSeconds: 20 });
    expect([r.timed_out, r.exit_code]).toEqual([false, 0]);
  });

  it("times out a command whose main thread exited alone while another thread runs", async () => {
    const id = (await h.create()).workspace_id;
    const r = await h.pyro.execWorkspace(id, `exec python3 -c ${q(LEADER_EXIT)}`, { timeoutSeconds: 3 });
    expect(r.timed_out).toBe(true);
    // And it was killed, its thread too: nothing of it is left.
    const left = await h.pyro.execWorkspace(
      id,
      "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done 2>/dev/null | grep -c '^python3' || true",
    );
    expect(left.stdout.trim()).toBe("0");
  });

  it("times out a command while a process outside the tree keeps starting ones with its marker", async () => {
    const id = await workspaceWith("/tmp/spawner.py", MARKER_SPAWNER);
    const cmd = [
      '( setsid env -u PYRO_EXEC_TOKEN python3 /tmp/spawner.py "$PYRO_EXEC_TOKEN" > /tmp/sp.log 2>&1 & )',
      "sleep 100",
    ].join("\n");
    const r = await h.pyro.execWorkspace(id, cmd, { timeoutSeconds: 3 });
    expect(r.timed_out).toBe(true);
  });

  it("answers a command whose hung-up job's main thread exits alone (no ptrace)", async () => {
    const id = await workspaceWith("/tmp/m.py", HUP_LEADER_EXIT);
    const cmd = [
      "python3 /tmp/m.py & echo $! > /tmp/m.pid",
      "(trap '' HUP; while :; do sleep 1000 & sleep 0.005; done) &",
      "sleep 0.3",
    ].join("\n");
    const r = await h.pyro.execWorkspace(id, cmd, { timeoutSeconds: 20 });
    expect([r.timed_out, r.exit_code]).toEqual([false, 0]);
  });

  it("answers a command that stops the command starter, and the next call too", async () => {
    const id = (await h.create()).workspace_id;
    // Every pyro-spawn but this shell (whose own command line names it).
    const stop = [
      "for p in /proc/[0-9]*; do",
      '  [ "${p#/proc/}" != $$ ] && grep -q pyro-spawn $p/cmdline 2>/dev/null && kill -STOP "${p#/proc/}"',
      "done; echo stopped",
    ].join("\n");
    const r = await h.pyro.execWorkspace(id, stop, { timeoutSeconds: 20 });
    expect([r.timed_out, r.stdout]).toEqual([false, "stopped\n"]);
    const next = await h.pyro.execWorkspace(id, "echo next", { timeoutSeconds: 20 });
    expect(next.stdout).toBe("next\n");
  });
});
