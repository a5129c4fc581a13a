import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  bwrapSkipReason,
  errorOf,
  type Harness,
  hostProcesses,
  openHarness,
  suiteTitle,
  waitUntil,
} from "../../helpers/sandbox.js";

/** Command execution in a real bwrap workspace: results, environment, cwd, timeout, output cap. */
const skip = bwrapSkipReason();
const MiB = 1024 * 1024;
// Set in this (host) process before the sandbox starts: it must never reach a command.
const HOST_ONLY_VAR = "PYRO_IT_HOST_ONLY_SECRET";

describe.skipIf(skip !== "")(suiteTitle("exec on bwrap", skip), () => {
  let h: Harness;
  let id: string;

  beforeAll(async () => {
    process.env[HOST_ONLY_VAR] = "must-not-leak";
    h = await openHarness("exec");
    id = (await h.create({ env: { FORWARDED: "from-create", SHADOWED: "create" } })).workspace_id;
    const mk = await h.pyro.execWorkspace(id, "mkdir -p sub/dir");
    expect(mk.exit_code, `workspace ${id}: ${mk.stderr}`).toBe(0);
  });
  afterAll(async () => {
    delete process.env[HOST_ONLY_VAR];
    await h?.cleanup();
  });

  it("returns the command's exit code and keeps stdout and stderr apart", async () => {
    const ok = await h.pyro.execWorkspace(id, "echo out; echo err >&2");
    expect(ok).toMatchObject({
      workspace_id: id,
      exit_code: 0,
      stdout: "out\n",
      stderr: "err\n",
      timed_out: false,
      truncated: false,
      execution_mode: "guest_agent",
    });
    expect((await h.pyro.execWorkspace(id, "exit 3")).exit_code).toBe(3);
    expect((await h.pyro.execWorkspace(id, "false")).exit_code).toBe(1);
    const missing = await h.pyro.execWorkspace(id, "no-such-command-here");
    expect(missing.exit_code).toBe(127);
    expect(missing.stderr).toContain("not found");
    // Killed by a signal: 128 + the signal number, as a shell reports it.
    expect((await h.pyro.execWorkspace(id, "kill -TERM $$")).exit_code).toBe(143);
  });

  it("gives commands the workspace's env and the call's env, and nothing from the host process", async () => {
    const r = await h.pyro.execWorkspace(id, "env", { env: { PER_CALL: "yes", SHADOWED: "call" } });
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
      HOME: "/root",
    });
    expect(vars.PATH).toContain("/usr/bin");
    expect(vars[HOST_ONLY_VAR]).toBeUndefined();
    expect(r.stdout).not.toContain("must-not-leak");
    expect(vars.PYRO_HOME).toBeUndefined();
  });

  it("runs in /workspace by default and in a cwd under it, and refuses a cwd outside it", async () => {
    expect((await h.pyro.execWorkspace(id, "pwd")).stdout).toBe("/workspace\n");
    expect((await h.pyro.execWorkspace(id, "pwd", { cwd: "sub/dir" })).stdout).toBe("/workspace/sub/dir\n");
    expect((await h.pyro.execWorkspace(id, "pwd", { cwd: "/workspace/sub" })).stdout).toBe(
      "/workspace/sub\n",
    );
    expect((await errorOf(h.pyro.execWorkspace(id, "pwd", { cwd: "/etc" }))).code).toBe(
      "path_outside_workspace",
    );
    expect((await errorOf(h.pyro.execWorkspace(id, "pwd", { cwd: "../.." }))).code).toBe(
      "path_outside_workspace",
    );
    expect((await errorOf(h.pyro.execWorkspace(id, "pwd", { cwd: "missing" }))).code).toBe("not_found");
  });

  it("kills the whole process tree at the timeout, children that called setsid included", async () => {
    const isSleeper = (argv: string[]) => argv[0]?.endsWith("sleep") === true && argv[1] === "1000";
    expect(hostProcesses(isSleeper), "a `sleep 1000` was already running before the test").toEqual([]);
    const started = Date.now();
    const r = await h.pyro.execWorkspace(id, "sleep 1000 & setsid sleep 1000 & sleep 1000", {
      timeoutSeconds: 2,
    });
    const elapsed = Date.now() - started;
    expect(r).toMatchObject({ timed_out: true, exit_code: 124 });
    expect(elapsed).toBeGreaterThanOrEqual(1900);
    expect(elapsed).toBeLessThan(8000);
    // exec returns after the kill; allow a moment for the kernel to reap.
    await waitUntil(() => hostProcesses(isSleeper).length === 0, 2000);
    expect(hostProcesses(isSleeper), `workspace ${id} left sleepers behind`).toEqual([]);
    // The workspace is still usable after a timeout.
    expect((await h.pyro.execWorkspace(id, "echo still-here")).stdout).toBe("still-here\n");
  });

  it("caps each output stream at 1 MiB, keeping its head and tail, and says truncated", async () => {
    const r = await h.pyro.execWorkspace(id, "head -c 3000000 /dev/zero");
    expect(r.exit_code).toBe(0);
    expect([r.stdout_bytes, r.truncated]).toEqual([3000000, true]);
    expect(r.stdout.replace(/\n\[\.\.\. 1951424 bytes omitted \.\.\.\]\n/, "").length).toBe(MiB);
    const both = await h.pyro.execWorkspace(id, "head -c 3000000 /dev/zero; head -c 2000000 /dev/zero >&2");
    expect([both.stdout_bytes, both.stderr_bytes, both.truncated]).toEqual([3000000, 2000000, true]);
    expect(both.stderr.replace(/\n\[\.\.\. 951424 bytes omitted \.\.\.\]\n/, "").length).toBe(MiB);
    const small = await h.pyro.execWorkspace(id, "head -c 1048576 /dev/zero");
    expect([small.stdout.length, small.stdout_bytes, small.truncated]).toEqual([MiB, MiB, false]);
    // The tail, where test runners print their summary, survives; --max-output-bytes cuts smaller.
    const seq = await h.pyro.execWorkspace(id, "seq 1 200000", { maxOutputBytes: 4096 });
    expect(seq).toMatchObject({ stdout_bytes: 1288895, truncated: true });
    expect(seq.stdout.startsWith("1\n2\n3\n")).toBe(true);
    expect(seq.stdout.endsWith("199999\n200000\n")).toBe(true);
    expect(seq.stdout).toContain(`[... ${1288895 - 4096} bytes omitted ...]`);
    const kept = await h.pyro.workspaceLogs(id, { seq: seq.seq });
    expect(kept.commands[0]).toMatchObject({ full_output: true, stdout_bytes: 1288895 });
    expect(kept.commands[0]!.stdout).toContain(`[... ${1288895 - MiB} bytes omitted ...]`);
  });

  it("reports duration_ms close to the command's wall time and records every command in the logs", async () => {
    const slow = await h.pyro.execWorkspace(id, "sleep 0.5");
    expect(slow.duration_ms).toBeGreaterThanOrEqual(450);
    expect(slow.duration_ms).toBeLessThan(3000);
    const fast = await h.pyro.execWorkspace(id, "true");
    expect(fast.duration_ms).toBeLessThan(slow.duration_ms);
    const logs = await h.pyro.workspaceLogs(id);
    expect(logs.commands.at(-1)).toMatchObject({ seq: fast.seq, command: "true", exit_code: 0 });
    expect(logs.commands.at(-2)).toMatchObject({
      seq: slow.seq,
      command: "sleep 0.5",
      duration_ms: slow.duration_ms,
    });
    expect(logs.commands.find((c) => c.timed_out)).toMatchObject({
      exit_code: 124,
      command: "sleep 1000 & setsid sleep 1000 & sleep 1000",
    });
  });
});
