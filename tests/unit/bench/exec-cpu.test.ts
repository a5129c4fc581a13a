import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { cpuTicks } from "../../../src/bench/exec-cpu.js";

describe("cpuTicks", () => {
  // A /proc/PID/stat line whose comm holds spaces and a ')', as a command can name itself.
  const stat = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 900 0 0 0 17 5 300 200 20 0 1 0 123456 0 0";

  it("reads utime + stime, and the reaped children's cutime + cstime when asked", () => {
    expect(cpuTicks(stat, false)).toBe(22);
    expect(cpuTicks(stat, true)).toBe(522);
  });

  it("matches process.cpuUsage for this process to within a few ticks", () => {
    // Burn ~200 ms so the tick count is well above its 10 ms resolution.
    const until = performance.now() + 200;
    while (performance.now() < until);
    const u = process.cpuUsage();
    const ticks = cpuTicks(readFileSync("/proc/self/stat", "utf8"), false);
    expect(Math.abs(ticks * 10 - (u.user + u.system) / 1000)).toBeLessThan(60);
  });
});
