import { mkdtemp, rm, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { cachedProbe, keepVerdict, PROBE_TTL_MS, verdictsFile } from "../../../src/core/probe-cache.js";

/**
 * Probe verdicts kept across CLI calls (core/probe-cache.ts): a working verdict is reused
 * only while its binary, kernel, user and PATH are unchanged and it is young; a refusal
 * and the backends whose verdict is not about a local binary are probed every time.
 */
describe("probe verdicts kept between processes", () => {
  let dir: string;
  let bin: string;
  let file: string;
  let calls: number;
  const env = { PATH: "/usr/bin:/bin" };
  const works = () => ({
    available: true,
    version: "bwrap 0.8.0",
    reason: null,
    opt_in: false,
    details: { path: bin },
  });
  const probe =
    (verdict = works) =>
    () => {
      calls++;
      return Promise.resolve(verdict());
    };

  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), "pyro-probe-cache-"));
    bin = join(dir, "bwrap");
    await writeFile(bin, "#!/bin/sh\n", { mode: 0o755 });
    file = verdictsFile(join(dir, "home"));
    calls = 0;
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("reuses a working verdict in a later process, and probes again once it is old", async () => {
    let now = 1_000_000;
    const clock = () => now;
    expect((await cachedProbe("bwrap", file, env, probe(), clock)).available).toBe(true);
    expect((await cachedProbe("bwrap", file, env, probe(), clock)).available).toBe(true);
    expect(calls).toBe(1);
    now += PROBE_TTL_MS + 1;
    await cachedProbe("bwrap", file, env, probe(), clock);
    expect(calls).toBe(2);
  });

  it("probes again when the binary, or PATH, changed", async () => {
    await cachedProbe("bwrap", file, env, probe());
    await utimes(bin, new Date(), new Date(Date.now() + 60_000));
    await cachedProbe("bwrap", file, env, probe());
    expect(calls).toBe(2);
    await cachedProbe("bwrap", file, { PATH: "/opt/other:/usr/bin" }, probe());
    expect(calls).toBe(3);
    await rm(bin);
    await cachedProbe("bwrap", file, env, probe());
    expect(calls).toBe(4);
  });

  it("never keeps a refusal, and a refusal forgets the working verdict", async () => {
    const refused = () => ({ ...works(), available: false, reason: "bwrap could not start a sandbox" });
    await cachedProbe("bwrap", file, env, probe(refused));
    await cachedProbe("bwrap", file, env, probe(refused));
    expect(calls).toBe(2);
    await cachedProbe("bwrap", file, env, probe());
    await keepVerdict("bwrap", file, env, refused());
    expect((await cachedProbe("bwrap", file, env, probe(refused))).available).toBe(false);
    expect(calls).toBe(4);
  });

  it("keeps nothing for backends whose verdict is not about a local binary (docker, qemu)", async () => {
    for (const name of ["docker", "qemu", "firecracker", "host"] as const) {
      await cachedProbe(name, file, env, probe());
      await cachedProbe(name, file, env, probe());
    }
    expect(calls).toBe(8);
  });

  it("treats a damaged file as nothing kept", async () => {
    await cachedProbe("bwrap", file, env, probe());
    await writeFile(file, "{not json");
    await cachedProbe("bwrap", file, env, probe());
    expect(calls).toBe(2);
  });
});
