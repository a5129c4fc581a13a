import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { preparedRunArgs } from "../../src/backends/bwrap/prepared-launch.js";
import type { Pyro } from "../../src/sdk/pyro.js";
import { bwrapSkipReason, type Harness, hostProcesses, openHarness, suiteTitle } from "../helpers/sandbox.js";

/**
 * Escape attempts through a bwrap one-shot's arguments (red-team review of the prepared
 * launch, backends/bwrap/prepared-launch.ts). A prepared run's command and variables reach
 * bwrap as NUL-separated options (`--args`) after its isolation flags, so a NUL inside a
 * value would end it and start an option of the attacker's: `--ro-bind / /hostroot` binds
 * the host's root into the sandbox (checked by hand: a command given to PreparedRun.run
 * directly read a host file). The refusal of NUL bytes is what stops it; the SDK's
 * schema lets NUL through in the command and in values, and an environment's own image
 * variables are merged in unchecked by the SDK.
 */
const skip = bwrapSkipReason();

/** The launch steps waiting under `home` (their pids). */
function waitingLaunches(home: string): number[] {
  const dir = join(home, "oneshot");
  return hostProcesses((a) => a.includes("pyro-prepared-launch") && a.some((x) => x.startsWith(dir))).map(
    (p) => p.pid,
  );
}

describe.skipIf(skip !== "")(
  suiteTitle("bwrap one-shot: option smuggling through the arguments", skip),
  () => {
    let h: Harness;
    let pooled: Pyro;
    let canary: string;
    let canaryText: string;

    beforeAll(async () => {
      h = await openHarness("escape-oneshot");
      const { Pyro } = await import("../../src/sdk/pyro.js");
      pooled = new Pyro({ home: h.home, environmentsDir: String(h.cliEnv.PYRO_ENV_CACHE), pool: 1 });
      canaryText = `host-secret-${randomBytes(8).toString("hex")}`;
      canary = join(await h.tempDir("canary"), "secret");
      const { writeFile } = await import("node:fs/promises");
      await writeFile(canary, canaryText, { mode: 0o600 });
    });
    afterAll(async () => {
      await pooled?.close();
      await h?.cleanup();
    });

    /** A launch prepared and waiting for the next run (made by a first run). */
    async function launchWaiting(): Promise<number[]> {
      await pooled.run("debian:12", "true", { backend: "bwrap" });
      await pooled.engine.launches.ready();
      const waiting = waitingLaunches(h.home);
      expect(waiting.length, `a prepared launch (${pooled.engine.launches.lastError ?? ""})`).toBeGreaterThan(
        0,
      );
      return waiting;
    }

    it("a NUL in the command or a variable's value is refused and binds nothing of the host", async () => {
      const bind = ["--ro-bind", "/", "/hostroot"].join("\0");
      const read = `cat /hostroot${canary} 2>&1; echo read-rc=$?`;
      const attempts: [string, Record<string, string>][] = [
        [`${read}\0${bind}`, {}],
        [read, { A: `x\0${bind}` }],
      ];
      for (const [command, env] of attempts) {
        const waiting = await launchWaiting();
        const r = await pooled.run("debian:12", command, { backend: "bwrap", env }).catch((e: Error) => e);
        // What the command read, had it run: the host's file is the escape.
        expect(JSON.stringify(r instanceof Error ? r.message : r)).not.toContain(canaryText);
        expect(r).toMatchObject({ code: "invalid_argument" });
        // Refused before the launch was taken: it still waits, nothing ran in it.
        expect(waitingLaunches(h.home)).toEqual(waiting);
      }
      expect(readFileSync(canary, "utf8")).toBe(canaryText);
    });

    it("the arguments file itself refuses a NUL (the launch takes the cold path instead)", () => {
      expect(() => preparedRunArgs("true\0--ro-bind\0/\0/hostroot", {})).toThrow(/NUL/);
      expect(() => preparedRunArgs("true", { A: "x\0--ro-bind\0/\0/hostroot" })).toThrow(/NUL/);
      expect(() => preparedRunArgs("true", { "A\0--ro-bind\0/\0/hostroot": "x" })).toThrow(/NUL/);
    });

    it("option-shaped commands and values reach the command as data, on the prepared and the cold path", async () => {
      const env = { A: "--ro-bind", B: "--ro-bind\n/\n/hostroot\n", C: "/ /hostroot", D: "--args 0 --" };
      const command = `printf '%s|' "$A" "$B" "$C" "$D"; ls -d /hostroot 2>&1; cat /hostroot${canary} 2>&1; true`;
      await launchWaiting();
      const prepared = await pooled.run("debian:12", command, { backend: "bwrap", env });
      const cold = await h.pyro.run("debian:12", command, { backend: "bwrap", env });
      for (const r of [prepared, cold]) {
        expect(r.stdout).toMatch(/^--ro-bind\|--ro-bind\n\/\n\/hostroot\n\|\/ \/hostroot\|--args 0 --\|/);
        expect(r.stdout + r.stderr).toMatch(/No such file/);
        expect(r.stdout + r.stderr).not.toContain(canaryText);
      }
    });
  },
);
