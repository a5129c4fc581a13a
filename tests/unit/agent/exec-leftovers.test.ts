import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { stillForking } from "../../../src/agent/guest/proctree.js";
import { type AgentFixture, startAgent } from "./helpers.js";

let fx: AgentFixture;
beforeEach(async () => {
  fx = await startAgent();
});
afterEach(() => fx.cleanup());

const run = (command: string, timeout_ms = 20_000) =>
  fx.client.request("exec", { command, timeout_ms, max_output_bytes: 1024 * 1024 });

/** Shell text counting the processes whose whole command line is `TAG 300` (exec -a'd sleeps). */
const countCmd = (tag: string) => `ps -eo args= | grep -cx '${tag} 300'`;

/** Processes on this host named `tag` by `exec -a` (commands that mention the tag do not count). */
async function countTagged(tag: string): Promise<number> {
  const r = await run(`${countCmd(tag)} || true`);
  return Number(r.stdout.trim());
}

describe("exec: what a command leaves running", () => {
  it("ends the background jobs a command leaves in its session when it returns", async () => {
    const tag = `pyro-bg-${process.pid}-${Date.now()}`;
    const r = await run(
      `for i in 1 2 3 4 5; do bash -c 'exec -a ${tag} sleep 300' & done; sleep 0.3; ${countCmd(tag)}`,
    );
    // They ran (5 while the command lived), and none is left after it.
    expect(r.stdout.trim()).toBe("5");
    expect(await countTagged(tag)).toBe(0);
  });

  it("ends a forking tree that is still growing when its command returns", async () => {
    const tag = `pyro-bomb-${process.pid}-${Date.now()}`;
    // A bounded bomb: each level forks two more and then waits, 6 levels deep (127 processes).
    const bomb = `b() { if [ "$1" -gt 0 ]; then b $(($1-1)) & b $(($1-1)) & fi; exec -a ${tag} sleep 300; }; b 6 & sleep 0.5; exit 0`;
    const r = await run(`bash -c '${bomb.replace(/'/g, "'\\''")}'; ${countCmd(tag)}`);
    expect(Number(r.stdout.trim())).toBeGreaterThan(10);
    expect(await countTagged(tag)).toBe(0);
  });

  it("keeps what asked to outlive the call: nohup and setsid", async () => {
    const tag = `pyro-keep-${process.pid}-${Date.now()}`;
    await run(
      `nohup bash -c 'exec -a ${tag}-nohup sleep 300' >/dev/null 2>&1 & setsid bash -c 'exec -a ${tag}-setsid sleep 300' >/dev/null 2>&1 & exit 0`,
    );
    try {
      expect(await countTagged(`${tag}-nohup`)).toBe(1);
      expect(await countTagged(`${tag}-setsid`)).toBe(1);
    } finally {
      await run(`pkill -f '${tag}' || true`);
    }
  });
});

describe("stillForking: what the hangup waits for", () => {
  const leader = "/bin/sh\0-c\0nohup sleep 300 &\0";
  it("waits for a process inside execve (its command line reads empty until the kernel writes it)", () => {
    // Measured on every exec: a child's /proc/PID/cmdline reads "" between the switch to
    // the new program's memory and its arguments being written there. A hangup in that
    // window killed `nohup sleep 300 &` on a loaded CI machine.
    expect(stillForking("", leader, null)).toBe(true);
  });
  it("waits for a fork that has not exec'd yet, and for nohup and setsid themselves", () => {
    expect(stillForking(leader, leader, "/sbin/init\0")).toBe(true);
    expect(stillForking("bash\0-c\0x\0", null, "bash\0-c\0x\0")).toBe(true);
    expect(stillForking("nohup\0sleep\x00300\0", leader, null)).toBe(true);
    expect(stillForking("/usr/bin/setsid\0server\0", leader, null)).toBe(true);
  });
  it("does not wait for what has become its own program", () => {
    expect(stillForking("sleep\x00300\0", leader, leader)).toBe(false);
    expect(stillForking("python3\0-m\0http.server\0", leader, "bash\0")).toBe(false);
  });
});
