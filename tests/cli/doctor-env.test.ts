import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { cli } from "../helpers/cli.js";

let home: string;
let env: NodeJS.ProcessEnv;
beforeAll(async () => {
  home = await mkdtemp(join(tmpdir(), "pyro-cli-"));
  env = { PYRO_HOME: home, PYRO_ENV_CACHE: join(home, "environments") };
});
afterAll(async () => {
  await rm(home, { recursive: true, force: true });
});

describe("pyro doctor", () => {
  it("--json names every backend with availability, version, reason and the default", async () => {
    const r = await cli(["doctor", "--json"], env);
    expect(r.code).toBe(0);
    const report = r.json();
    expect(report.backends.map((b: { name: string }) => b.name)).toEqual([
      "firecracker",
      "qemu",
      "gvisor",
      "docker",
      "bwrap",
      "host",
    ]);
    for (const b of report.backends) {
      expect(Object.keys(b)).toEqual(
        expect.arrayContaining([
          "name",
          "isolation",
          "available",
          "version",
          "reason",
          "opt_in",
          "implemented",
          "default",
          "details",
          "probe_ms",
        ]),
      );
      expect(typeof b.available).toBe("boolean");
      if (!b.available) expect(b.reason).toEqual(expect.any(String));
    }
    expect(report.backends.find((b: { name: string }) => b.name === "host")).toMatchObject({
      available: true,
      opt_in: true,
      default: false,
    });
    expect(report.kvm).toEqual({
      present: expect.any(Boolean),
      usable: expect.any(Boolean),
      reason: report.kvm.usable ? null : expect.any(String),
    });
    expect(report.cache).toMatchObject({ path: join(home, "environments"), home });
    expect(report.cache.environments.map((e: { name: string }) => e.name)).toEqual([
      "debian:12",
      "debian:12-base",
      "debian:12-build",
      "debian:12-node",
      "debian:12-python",
    ]);
    expect(report).not.toHaveProperty("environment");
  });

  it("gives a cold verdict for an environment that is not cached", async () => {
    const r = await cli(["doctor", "--environment", "debian:12-build", "--json"], env);
    expect(r.code).toBe(0);
    expect(r.json().environment).toMatchObject({ name: "debian:12-build", readiness: "cold" });
  });

  it("prints a human table by default", async () => {
    const r = await cli(["doctor"], env);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^backend\s+available/m);
    expect(r.stdout).toMatch(/default backend:/);
  });

  it("fails for an unknown environment with environment_not_found, exit 1 and no stack trace", async () => {
    const r = await cli(["doctor", "--environment", "nope:1", "--json"], env);
    expect(r.code).toBe(1);
    expect(r.json()).toEqual({
      error: {
        code: "environment_not_found",
        message: "unknown environment 'nope:1'",
        hint: expect.stringContaining("debian:12"),
      },
    });
    expect(r.stderr).toMatch(/^pyro: error \[environment_not_found\]/);
    expect(r.stderr).not.toMatch(/\n\s+at /);
  });
});

describe("pyro env", () => {
  it("list --json shows every official environment with its cache status", async () => {
    const r = await cli(["env", "list", "--json"], env);
    expect(r.code).toBe(0);
    const body = r.json();
    expect(body.count).toBe(5);
    expect(body.environments[0]).toMatchObject({
      name: "debian:12",
      status: "missing",
      recipe_key: expect.stringMatching(/^[0-9a-f]{16}$/),
    });
  });

  it("inspect shows the recipe of an environment", async () => {
    const r = await cli(["env", "inspect", "debian:12", "--json"], env);
    expect(r.code).toBe(0);
    expect(r.json()).toMatchObject({
      name: "debian:12",
      source: { kind: "debootstrap", suite: "bookworm" },
      manifest: null,
    });
  });

  it("pull of an unknown name fails with environment_not_found listing the known ones", async () => {
    const r = await cli(["env", "pull", "alpine:3", "--json"], env);
    expect(r.code).toBe(1);
    expect(r.json().error.code).toBe("environment_not_found");
    expect(r.json().error.hint).toContain(
      "use an official environment (debian:12, debian:12-base, debian:12-build, debian:12-node, debian:12-python)",
    );
    const human = await cli(["env", "pull", "alpine:3"], env);
    expect(human.stdout).toBe("");
    expect(human.stderr.trim().split("\n")).toHaveLength(1);
  });

  it("prune on an empty cache removes nothing", async () => {
    const r = await cli(["env", "prune", "--json"], env);
    expect(r.code).toBe(0);
    expect(r.json()).toEqual({ removed: [], freed_bytes: 0, kept_in_use: [] });
  });

  it("rejects unknown commands and options as usage errors (exit 2)", async () => {
    const r = await cli(["env", "frobnicate", "--json"], env);
    expect(r.code).toBe(2);
    expect(r.json().error.code).toBe("invalid_argument");
  });
});
