import { Readable } from "node:stream";
import { expect } from "vitest";
import type { Pyro } from "../../src/sdk/pyro.js";
import { pyro as cliPyro } from "../helpers/cli.js";
import { exited, hostProcesses, spawnCli, waitUntil } from "../helpers/sandbox.js";
import type { Scenario, ScenarioContext } from "./scenarios.js";
import { code, sandboxed, withWorkspace } from "./util.js";

/**
 * Command execution on every backend: results, environment, cwd, the output caps, the
 * timeout and the command log. One workspace; the parts run in order on it.
 */
const MiB = 1024 * 1024;
/** The timeout part's command; its argument is rare so the host-wide process check sees only it. */
const SLEEPERS = "sleep 613 & (setsid sleep 613 &) ; setsid sleep 613 & sleep 613";

async function results(ctx: ScenarioContext, id: string) {
  const p = ctx.pyro;
  expect(await p.execWorkspace(id, "echo out; echo err >&2; exit 7")).toMatchObject({
    workspace_id: id,
    exit_code: 7,
    stdout: "out\n",
    stderr: "err\n",
    timed_out: false,
    truncated: false,
    execution_mode: ctx.target.backend === "host" ? "host_compat" : "guest_agent",
  });
  expect((await p.execWorkspace(id, "false")).exit_code).toBe(1);
  // A missing command is 127; a command killed by a signal is 128+N.
  const missing = await p.execWorkspace(id, "no-such-command-here");
  expect([missing.exit_code, missing.stderr.includes("not found")]).toEqual([127, true]);
  expect((await p.execWorkspace(id, "kill -TERM $$")).exit_code).toBe(143);
}

/** The workspace's env and the call's (which wins), and nothing of the host side's. */
async function environment(ctx: ScenarioContext, id: string) {
  const p = ctx.pyro;
  const r = await p.execWorkspace(id, "env", {
    env: { PER_CALL: "yes", SHADOWED: "call", GREETING: "hi there" },
  });
  const vars = Object.fromEntries(
    r.stdout
      .trim()
      .split("\n")
      .map((l) => [l.slice(0, l.indexOf("=")), l.slice(l.indexOf("=") + 1)]),
  );
  expect(vars).toMatchObject({
    FORWARDED: "from-create",
    PER_CALL: "yes",
    SHADOWED: "call",
    GREETING: "hi there",
  });
  expect(vars.PATH).toContain("/usr/bin");
  if (sandboxed(ctx)) expect(vars.HOME).toBe("/root");
  // The engine's own env (PARITY_HOST_VAR, DOCKER_HOST, PYRO_*) never reaches a command;
  // the in-process fake has no isolation to hold this.
  if (ctx.target.real) {
    expect([vars.PARITY_HOST_VAR, vars.DOCKER_HOST, vars.PYRO_HOME]).toEqual([
      undefined,
      undefined,
      undefined,
    ]);
    expect(r.stdout).not.toContain("from-the-host-env");
  }
}

async function cwd(ctx: ScenarioContext, id: string) {
  const p = ctx.pyro;
  // The effect of cwd, not the path string: host-compat runs in a host directory.
  expect((await p.execWorkspace(id, "ls")).stdout).toContain("app.py\n");
  expect((await p.execWorkspace(id, "ls", { cwd: "/workspace/src" })).stdout).toBe("lib.txt\n");
  expect((await p.execWorkspace(id, "ls", { cwd: "src" })).stdout).toBe("lib.txt\n");
  if (sandboxed(ctx)) {
    expect((await p.execWorkspace(id, "pwd")).stdout).toBe("/workspace\n");
    expect((await p.execWorkspace(id, "pwd", { cwd: "src" })).stdout).toBe("/workspace/src\n");
  }
  expect(await code(p.execWorkspace(id, "pwd", { cwd: "/etc" }))).toBe("path_outside_workspace");
  expect(await code(p.execWorkspace(id, "pwd", { cwd: "../.." }))).toBe("path_outside_workspace");
  expect(await code(p.execWorkspace(id, "pwd", { cwd: "missing" }))).toBe("not_found");
}

/** Past 1 MiB a stream keeps its first and last 512 KiB around one marker line; each stream on its own. */
async function caps(p: Pyro, id: string) {
  const big = await p.execWorkspace(
    id,
    "head -c 1500000 /dev/zero | tr '\\0' a; echo end; head -c 2000000 /dev/zero >&2",
  );
  expect([big.exit_code, big.stdout_bytes, big.stderr_bytes, big.truncated]).toEqual([
    0,
    1500004,
    2000000,
    true,
  ]);
  expect(big.stdout).toBe(
    `${"a".repeat(512 * 1024)}\n[... ${1500004 - MiB} bytes omitted ...]\n${"a".repeat(512 * 1024 - 4)}end\n`,
  );
  expect(big.stderr.replace(`\n[... ${2000000 - MiB} bytes omitted ...]\n`, "").length).toBe(MiB);
  const exact = await p.execWorkspace(id, "head -c 1048576 /dev/zero");
  expect([exact.stdout.length, exact.stdout_bytes, exact.truncated]).toEqual([MiB, MiB, false]);
  // The tail, where test runners print their summary, survives; maxOutputBytes cuts smaller,
  // and the log keeps the output at the full cap.
  const seq = await p.execWorkspace(id, "seq 1 200000", { maxOutputBytes: 4096 });
  expect(seq).toMatchObject({ stdout_bytes: 1288895, truncated: true });
  expect(seq.stdout.startsWith("1\n2\n3\n")).toBe(true);
  expect(seq.stdout.endsWith("199999\n200000\n")).toBe(true);
  expect(seq.stdout).toContain(`[... ${1288895 - 4096} bytes omitted ...]`);
  const kept = await p.workspaceLogs(id, { seq: seq.seq });
  expect(kept.commands[0]).toMatchObject({ full_output: true, stdout_bytes: 1288895 });
  expect(kept.commands[0]!.stdout).toContain(`[... ${1288895 - MiB} bytes omitted ...]`);
}

/** The timeout kills the whole tree, setsid children included, and the workspace goes on. */
async function timeout(p: Pyro, id: string) {
  const isSleeper = (argv: string[]) => argv[0]?.endsWith("sleep") === true && argv[1] === "613";
  const started = Date.now();
  const slow = await p.execWorkspace(id, SLEEPERS, { timeoutSeconds: 2 });
  const elapsed = Date.now() - started;
  expect(slow).toMatchObject({ timed_out: true, exit_code: 124 });
  expect(elapsed).toBeGreaterThanOrEqual(1900);
  expect(elapsed).toBeLessThan(20_000);
  expect(
    (await p.execWorkspace(id, "ps -eo args 2>/dev/null | grep -c '^sleep 613' || true")).stdout.trim(),
  ).toBe("0");
  // Seen from the host too, where a sandbox's processes are host processes (the kernel
  // may take a moment to reap them after exec returns).
  await waitUntil(() => hostProcesses(isSleeper).length === 0, 3000);
  expect(hostProcesses(isSleeper), `workspace ${id} left sleepers behind`).toEqual([]);
  expect((await p.execWorkspace(id, "echo still-here")).stdout).toBe("still-here\n");
}

/**
 * What a command leaves running: its background jobs end with the call, a double-forked
 * one too (still in its session); nohup and setsid outlive it. Each backend's agent finds
 * them its own way (bwrap, gVisor, docker: through the command starter, which holds its
 * commands' orphans; the VMs and host-compat: a /proc scan), so each is held here.
 */
async function leftovers(p: Pyro, id: string) {
  const running = async (arg: string) =>
    (await p.execWorkspace(id, `cat /proc/[0-9]*/cmdline | tr '\\0' ' '`)).stdout.includes(`sleep ${arg} `);
  const r = await p.execWorkspace(id, "sleep 621 & (sleep 622 >/dev/null 2>&1 &); true");
  expect(r.exit_code).toBe(0);
  expect([await running("621"), await running("622")]).toEqual([false, false]);
  await p.execWorkspace(id, "nohup sleep 623 >/dev/null 2>&1 & setsid sleep 624 >/dev/null 2>&1 &");
  expect([await running("623"), await running("624")]).toEqual([true, true]);
  // With survivors about, a later command's job still ends with it.
  await p.execWorkspace(id, "(sleep 625 >/dev/null 2>&1 &); true");
  expect(await running("625")).toBe(false);
  await p.execWorkspace(
    id,
    `for d in /proc/[0-9]*; do case "$(tr '\\0' ' ' < $d/cmdline 2>/dev/null)" in "sleep 623 "|"sleep 624 ") kill \${d#/proc/};; esac; done`,
  );
  await expect.poll(async () => [await running("623"), await running("624")]).toEqual([false, false]);
}

/** duration_ms is the command's wall time, and the log records every command. */
async function durationsAndLog(p: Pyro, id: string) {
  const slow = await p.execWorkspace(id, "sleep 0.5");
  expect(slow.duration_ms).toBeGreaterThanOrEqual(450);
  expect(slow.duration_ms).toBeLessThan(3000);
  const fast = await p.execWorkspace(id, "true");
  expect(fast.duration_ms).toBeLessThan(slow.duration_ms);
  const logs = await p.workspaceLogs(id);
  expect(logs.commands.at(-1)).toMatchObject({ seq: fast.seq, command: "true", exit_code: 0 });
  expect(logs.commands.at(-2)).toMatchObject({
    seq: slow.seq,
    command: "sleep 0.5",
    duration_ms: slow.duration_ms,
  });
  expect(logs.commands.find((c) => c.timed_out)).toMatchObject({ exit_code: 124, command: SLEEPERS });
}

/** A CLI process SIGKILLed mid-exec: its command is killed and the workspace stays usable. */
async function cliKilled(ctx: ScenarioContext, id: string) {
  const p = ctx.pyro;
  // A VM in software (qemu, TCG) starts and answers slower than the namespace sandboxes.
  const slow = ctx.target.backend === "qemu" ? 3 : 1;
  const child = spawnCli(
    ["workspace", "exec", id, "--", "sh", "-c", "echo started > started.txt; sleep 615"],
    ctx.cliEnv,
  );
  const started = async () => (await p.execWorkspace(id, "cat started.txt 2>/dev/null || true")).stdout;
  expect(
    await waitUntil(async () => (await started()) === "started\n", 30_000 * slow, 200),
    child.output(),
  ).toBe(true);
  child.kill("SIGKILL");
  expect(await exited(child)).toBe("SIGKILL");
  const count =
    "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 615' || true";
  const gone = async () => (await p.execWorkspace(id, count)).stdout.trim() === "0";
  expect(await waitUntil(gone, 10_000 * slow, 200), `sleep 615 survived its killed client in ${id}`).toBe(
    true,
  );
  const isSleep = (argv: string[]) => argv[0]?.endsWith("sleep") === true && argv[1] === "615";
  expect(await waitUntil(() => hostProcesses(isSleep).length === 0, 5_000)).toBe(true);
  const next = cliPyro(["workspace", "exec", id, "--", "echo", "alive"], ctx.cliEnv, 60_000 * slow);
  expect([next.code, next.stdout], next.stderr).toEqual([0, "alive\n"]);
}

/** A one-shot run: a sandbox for one command, with exec's results, stdin, cap and timeout. */
async function oneShot(ctx: ScenarioContext) {
  const p = ctx.pyro;
  const backend = ctx.createOptions.backend;
  const opts = { backend, ...(ctx.createOptions.allowHostCompat ? { allowHostCompat: true } : {}) };
  const before = (await p.listWorkspaces()).count;
  const r = await p.run(
    "debian:12",
    "cat; echo err >&2; head -c 1500000 /dev/zero | tr '\\0' a; echo end; exit 7",
    { ...opts, stdin: Readable.from([Buffer.from("via stdin\n")]) },
  );
  expect(r).toMatchObject({
    environment: "debian:12",
    backend,
    execution_mode: backend === "host" ? "host_compat" : "guest_agent",
    exit_code: 7,
    stderr: "err\n",
    stdout_bytes: 1500014,
    truncated: true,
    timed_out: false,
  });
  expect(r.stdout).toBe(
    `via stdin\n${"a".repeat(512 * 1024 - 10)}\n[... ${1500014 - MiB} bytes omitted ...]\n${"a".repeat(512 * 1024 - 4)}end\n`,
  );
  const isSleeper = (argv: string[]) => argv[0]?.endsWith("sleep") === true && argv[1] === "614";
  const started = Date.now();
  const t = await p.run("debian:12", "sleep 614 & (setsid sleep 614 &) ; sleep 614", {
    ...opts,
    timeoutSeconds: 2,
  });
  expect(t).toMatchObject({ exit_code: 124, timed_out: true });
  // The sandbox's start counts here too; a qemu VM boots in software (TCG).
  expect(Date.now() - started).toBeLessThan(backend === "qemu" ? 120_000 : 20_000);
  await waitUntil(() => hostProcesses(isSleeper).length === 0, 3000);
  expect(hostProcesses(isSleeper)).toEqual([]);
  expect((await p.listWorkspaces()).count).toBe(before);
}

export const EXEC_SCENARIOS: Scenario[] = [
  {
    name: "exec: exit codes, stderr, env, cwd, output caps (head and tail, per stream, per call), a timeout that kills the whole tree, leftovers (background jobs end, nohup and setsid stay; real backends), durations and the log; a CLI SIGKILLed mid-exec (real backends)",
    run: (ctx) =>
      withWorkspace(
        ctx,
        async (id) => {
          await results(ctx, id);
          await environment(ctx, id);
          await cwd(ctx, id);
          await caps(ctx.pyro, id);
          await timeout(ctx.pyro, id);
          if (ctx.target.real) await leftovers(ctx.pyro, id);
          await durationsAndLog(ctx.pyro, id);
          // Needs the CLI in another process, which cannot reach the in-process fake.
          if (ctx.target.real) await cliKilled(ctx, id);
        },
        { env: { FORWARDED: "from-create", SHADOWED: "create" } },
      ),
  },
  {
    name: "one-shot run: exit code, stderr, stdin, the output cap (head and tail), a timeout that kills everything; no workspace left",
    run: oneShot,
  },
];
