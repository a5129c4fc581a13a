import { afterEach, beforeEach, describe, expect, it } from "vitest";
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
