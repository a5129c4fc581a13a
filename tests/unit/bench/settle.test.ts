import { type ChildProcess, spawn } from "node:child_process";
import { once } from "node:events";
import { afterEach, describe, expect, it } from "vitest";
import { treeCpuTicks, waitQuiet } from "../../../src/bench/settle.js";

// A shell whose child burns `cpuMs` of CPU time (not wall time: the machine may be
// loaded), says "done", then stays alive idle; or burns forever with cpuMs = -1.
function tree(cpuMs: number): ChildProcess {
  const burn = `const u=()=>{const c=process.cpuUsage();return (c.user+c.system)/1000};while(${cpuMs}<0||u()<${cpuMs});console.log("done");setTimeout(()=>{},60000)`;
  return spawn("/bin/sh", ["-c", `${JSON.stringify(process.execPath)} -e '${burn}'; sleep 60`], {
    stdio: ["ignore", "pipe", "ignore"],
    detached: true,
  });
}

const started: ChildProcess[] = [];
afterEach(() => {
  for (const c of started.splice(0)) if (c.pid) process.kill(-c.pid, "SIGKILL");
});

describe("treeCpuTicks", () => {
  it("counts the CPU time of a process's descendants", async () => {
    const sh = tree(400);
    started.push(sh);
    await once(sh.stdout!, "data");
    // The shell itself used next to nothing; its child ~400 ms (40 ticks).
    expect(await treeCpuTicks(sh.pid!)).toBeGreaterThanOrEqual(35);
  });
});

describe("waitQuiet", () => {
  it("settles once the tree is idle", async () => {
    const sh = tree(200);
    started.push(sh);
    await once(sh.stdout!, "data");
    const r = await waitQuiet(sh.pid!, { windowMs: 100, timeoutMs: 10_000 });
    expect(r.settled).toBe(true);
  });

  it("does not settle while a descendant keeps a core busy", async () => {
    const sh = tree(-1);
    started.push(sh);
    const r = await waitQuiet(sh.pid!, { windowMs: 100, timeoutMs: 1500 });
    expect(r.settled).toBe(false);
  });
});
