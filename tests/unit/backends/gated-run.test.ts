import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { runGatedOneShot } from "../../../src/backends/gated-run.js";
import type { CgroupLimits } from "../../../src/backends/linux/cgroups.js";

/**
 * A one-shot's launch waits at its gate (one stdin line) until it is placed in its cgroup.
 * A run cancelled before then (its signal aborted while the caller made the disk and the
 * cgroup, or before the call) must not open the gate: the abort listener is added too late
 * to hear it (red-team review: an aborted `pyro.run` ran its command to the end).
 */
describe("runGatedOneShot", () => {
  const dir = mkdtempSync(join(tmpdir(), "pyro-gated-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const cgroups = { addProcess: async () => {}, destroy: async () => {} } as unknown as CgroupLimits;
  const gatedTouch = (file: string) => ["/bin/sh", "-c", `read gate && touch ${file}`];

  it("does not release a launch whose signal was aborted before the run", async () => {
    const ran = join(dir, "ran-aborted");
    const run = runGatedOneShot(gatedTouch(ran), {
      cgroups,
      what: "test",
      maxOutputBytes: 1024,
      timeoutMs: 10_000,
      signal: AbortSignal.abort(),
    });
    await expect(run).rejects.toMatchObject({ code: "cancelled" });
    await new Promise((r) => setTimeout(r, 200));
    expect(existsSync(ran)).toBe(false);
  });

  it("releases it otherwise (the same launch runs)", async () => {
    const ran = join(dir, "ran");
    const r = await runGatedOneShot(gatedTouch(ran), {
      cgroups,
      what: "test",
      maxOutputBytes: 1024,
      timeoutMs: 10_000,
      signal: new AbortController().signal,
    });
    expect(r.exit_code).toBe(0);
    expect(existsSync(ran)).toBe(true);
  });
});
