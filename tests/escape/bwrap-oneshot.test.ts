import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import { createServer as netServer, type Server } from "node:net";
import { networkInterfaces } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { preparedRunArgs } from "../../src/backends/bwrap/prepared-launch.js";
import type { Pyro } from "../../src/sdk/pyro.js";
import { REPO_ROOT } from "../helpers/cli.js";
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

/**
 * The escape suite's in-sandbox attempts (probe.py, written for workspaces) run as a
 * one-shot's command, cold and in a prepared launch: a one-shot's bwrap argv is built apart
 * from a workspace's (oneshot-argv.ts, and `--args` for a prepared one), so the workspace
 * suite does not cover it. "host log grown through inherited descriptors" is not judged:
 * a one-shot's pid 1 writes to the command's own output pipe (capped), not to a log.
 */
describe.skipIf(skip !== "")(suiteTitle("bwrap one-shot: the escape suite's attempts", skip), () => {
  let h: Harness;
  let pooled: Pyro;
  let marker: ChildProcess;
  let listener: Server;
  let unixListener: Server;
  let connections = 0;
  let args: Record<string, unknown>;
  let writeTarget: string;
  const tag = randomBytes(6).toString("hex");
  const NOT_JUDGED = new Set(["host log grown through inherited descriptors"]);

  beforeAll(async () => {
    h = await openHarness("escape-oneshot-probe");
    const { Pyro } = await import("../../src/sdk/pyro.js");
    pooled = new Pyro({ home: h.home, environmentsDir: String(h.cliEnv.PYRO_ENV_CACHE), pool: 1 });
    const dir = await h.tempDir("probe-host");
    const canary = join(dir, "canary");
    await writeFile(canary, `canary-${tag}`, { mode: 0o600 });
    await writeFile(join(dir, `other-marker-${tag}`), "another sandbox's file");
    writeTarget = join(dir, "written");
    const markerText = `pyro-oneshot-marker-${tag}`;
    // A host process whose name and environment must stay out of reach.
    marker = spawn("sleep", ["600"], {
      argv0: markerText,
      stdio: "ignore",
      env: { PATH: process.env.PATH, SECRET_X: `other-secret-${tag}` },
    });
    listener = netServer((c) => {
      connections++;
      c.destroy();
    });
    await new Promise<void>((ok) => listener.listen(0, "0.0.0.0", ok));
    unixListener = netServer((c) => {
      connections++;
      c.destroy();
    });
    const sock = join(dir, "other.sock");
    await new Promise<void>((ok) => unixListener.listen(sock, ok));
    args = {
      host_marker_reversed: [...markerText].reverse().join(""),
      host_marker_pid: marker.pid,
      host_env_values: [h.home, String(h.cliEnv.PYRO_ENV_CACHE)],
      host_canary: canary,
      host_canary_content: `canary-${tag}`,
      host_write_target: writeTarget,
      host_paths: [join(h.home, "state.db"), h.home, join(h.home, "oneshot"), dir],
      other_marker: `other-marker-${tag}`,
      other_socket: sock,
      other_secret: `other-secret-${tag}`,
      host_port: (listener.address() as { port: number }).port,
      host_ips: Object.values(networkInterfaces())
        .flat()
        .filter((i) => i && i.family === "IPv4" && !i.internal)
        .map((i) => i!.address),
    };
  });
  afterAll(async () => {
    marker?.kill("SIGKILL");
    listener?.close();
    unixListener?.close();
    await pooled?.close();
    await h?.cleanup();
  });

  /** probe.py's report from a one-shot run by `pyro` (its output after the last MARK line). */
  async function probe(pyro: Pyro): Promise<Record<string, { escaped: boolean; detail: string }>> {
    const code = readFileSync(join(REPO_ROOT, "tests", "escape", "probe.py"));
    const r = await pyro.run(
      "debian:12",
      `cat > /tmp/probe.py; python3 /tmp/probe.py '${JSON.stringify(args)}' > /tmp/report; echo; echo MARK; cat /tmp/report`,
      { backend: "bwrap", stdin: Readable.from([code]), timeoutSeconds: 240, maxOutputBytes: 4 << 20 },
    );
    const report = r.stdout.split("\nMARK\n").pop() ?? "";
    try {
      return JSON.parse(report);
    } catch {
      throw new Error(`probe.py did not report (exit ${r.exit_code}): ${r.stderr.slice(-2000)}`);
    }
  }

  function judge(report: Record<string, { escaped: boolean; detail: string }>): void {
    // As many attempts as the workspace suite makes (probe.py's 43 today).
    expect(Object.keys(report).length).toBeGreaterThanOrEqual(40);
    for (const [name, r] of Object.entries(report))
      if (!NOT_JUDGED.has(name)) expect(r.escaped, `${name}: ${r.detail}`).toBe(false);
    expect(marker.exitCode).toBeNull();
    expect(marker.signalCode).toBeNull();
    expect(connections).toBe(0);
    expect(existsSync(writeTarget)).toBe(false);
  }

  it("cold: every in-sandbox attempt is refused", { timeout: 300_000 }, async () => {
    judge(await probe(h.pyro));
  });

  it("in a prepared launch: every in-sandbox attempt is refused", { timeout: 300_000 }, async () => {
    await pooled.run("debian:12", "true", { backend: "bwrap" });
    await pooled.engine.launches.ready();
    const before = waitingLaunches(h.home);
    expect(before.length, "a prepared launch").toBeGreaterThan(0);
    const report = await probe(pooled);
    // The probe ran in the launch that was waiting (it is gone: used once).
    await pooled.engine.launches.ready();
    expect(waitingLaunches(h.home).filter((p) => before.includes(p))).toEqual([]);
    judge(report);
  });
});
