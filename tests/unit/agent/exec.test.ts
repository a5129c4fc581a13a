import { mkdir, readFile } from "node:fs/promises";
import path from "node:path";
import { Readable } from "node:stream";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { AgentError } from "../../../src/agent/errors.js";
import { type AgentFixture, alive, eventually, startAgent } from "./helpers.js";

let fx: AgentFixture;
beforeEach(async () => {
  fx = await startAgent();
});
afterEach(() => fx.cleanup());

const run = (
  command: string,
  extra: {
    cwd?: string;
    env?: Record<string, string>;
    timeout_ms?: number;
    max_output_bytes?: number;
    log_output_bytes?: number;
  } = {},
) => fx.client.request("exec", { command, timeout_ms: 10_000, max_output_bytes: 1024 * 1024, ...extra });

async function pidsIn(file: string): Promise<number[]> {
  const text = await readFile(path.join(fx.root, file), "utf8");
  return text.split(/\s+/).filter(Boolean).map(Number);
}

describe("exec", () => {
  it("reports exit codes, stdout and stderr separately", async () => {
    const r = await run("echo out; echo err >&2; exit 3");
    expect(r).toMatchObject({
      exit_code: 3,
      stdout: "out\n",
      stderr: "err\n",
      timed_out: false,
      truncated: false,
    });
    expect(r.duration_ms).toBeGreaterThanOrEqual(0);
    expect((await run("true")).exit_code).toBe(0);
  });

  it("reports a death by signal as 128 + the signal number", async () => {
    expect((await run("kill -TERM $$")).exit_code).toBe(143);
    expect((await run("kill -KILL $$")).exit_code).toBe(137);
  });

  it("runs in the root by default and in a contained cwd when given", async () => {
    await mkdir(path.join(fx.root, "sub/dir"), { recursive: true });
    expect((await run("pwd")).stdout.trim()).toBe(fx.root);
    expect((await run("pwd", { cwd: "sub/dir" })).stdout.trim()).toBe(path.join(fx.root, "sub/dir"));
    const err = await run("pwd", { cwd: "../" }).catch((e: AgentError) => e);
    expect((err as AgentError).code).toBe("path_outside_workspace");
    const missing = await run("pwd", { cwd: "nope" }).catch((e: AgentError) => e);
    expect((missing as AgentError).code).toBe("not_found");
  });

  it("starts from a clean base environment with the given variables merged over it", async () => {
    process.env.PYRO_TEST_LEAK = "leaked";
    try {
      // biome-ignore lint/suspicious/noTemplateCurlyInString: a shell expansion, not a template
      const r = await run('echo "$PATH|$HOME|$LANG|$TERM|$FOO|${PYRO_TEST_LEAK:-clean}"', {
        env: { FOO: "bar baz", TERM: "xterm" },
      });
      expect(r.stdout.trim()).toBe(
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin|/root|C.UTF-8|xterm|bar baz|clean",
      );
    } finally {
      delete process.env.PYRO_TEST_LEAK;
    }
  });

  it("gives the command an empty stdin", async () => {
    const r = await run("cat; echo done", { timeout_ms: 5000 });
    expect(r).toMatchObject({ stdout: "done\n", timed_out: false });
  });

  it("kills the whole tree at the timeout, including a backgrounded child", async () => {
    const started = Date.now();
    const r = await run("sleep 100 & echo $! > pids; sleep 100", { timeout_ms: 500 });
    expect(r.timed_out).toBe(true);
    expect(r.exit_code).toBe(124);
    expect(Date.now() - started).toBeLessThan(5000);
    const [bg] = await pidsIn("pids");
    expect(await eventually(async () => !(await alive(bg!)))).toBe(true);
  });

  it("kills children that started their own session, even once orphaned", async () => {
    // One setsid child whose parent shell lives on, one orphaned by a subshell that exits.
    const r = await run(
      "setsid sleep 100 & echo $! >> pids; (setsid sleep 101 & echo $! >> pids); sleep 100",
      {
        timeout_ms: 500,
      },
    );
    expect(r.timed_out).toBe(true);
    const pids = await pidsIn("pids");
    expect(pids).toHaveLength(2);
    for (const pid of pids) expect(await eventually(async () => !(await alive(pid)))).toBe(true);
  });

  it("caps each stream at max_output_bytes, keeps draining, and says truncated", async () => {
    const r = await run("head -c 200000 /dev/zero | tr '\\0' a; echo tail >&2", { max_output_bytes: 1000 });
    expect(r.stdout).toBe(`${"a".repeat(500)}\n[... 199000 bytes omitted ...]\n${"a".repeat(500)}`);
    expect(r.stderr).toBe("tail\n");
    expect([r.stdout_bytes, r.stderr_bytes]).toEqual([200000, 5]);
    expect(r.truncated).toBe(true);
    expect(r.exit_code).toBe(0);
  });

  it("keeps the head and the tail of `seq 1 200000` past the cap, with the exact count left out", async () => {
    const full = Array.from({ length: 200000 }, (_, i) => `${i + 1}\n`).join("");
    const MiB = 1024 * 1024;
    const r = await run("seq 1 200000");
    expect(r.stdout_bytes).toBe(full.length);
    expect(r.truncated).toBe(true);
    const [head, tail] = r.stdout.split(/\n\[\.\.\. \d+ bytes omitted \.\.\.\]\n/);
    expect(head).toBe(full.slice(0, MiB / 2));
    expect(tail).toBe(full.slice(full.length - MiB / 2));
    expect(r.stdout).toContain(`[... ${full.length - MiB} bytes omitted ...]`);
    expect(r.stdout.endsWith("199999\n200000\n")).toBe(true);
    expect(r.stdout_log).toBeUndefined();
  });

  it("cuts a second, larger copy of each stream for the history only where the first left something out", async () => {
    const full = Array.from({ length: 200000 }, (_, i) => `${i + 1}\n`).join("");
    const r = await run("seq 1 200000; echo short >&2", {
      max_output_bytes: 2000,
      log_output_bytes: 100_000,
    });
    expect(r.stdout).toBe(
      `${full.slice(0, 1000)}[... ${full.length - 2000} bytes omitted ...]\n${full.slice(-1000)}`,
    );
    expect(r.stdout_log).toBe(
      `${full.slice(0, 50_000)}\n[... ${full.length - 100_000} bytes omitted ...]\n${full.slice(-50_000)}`,
    );
    expect(r).toMatchObject({ stderr: "short\n", stderr_bytes: 6 });
    expect(r.stderr_log).toBeUndefined();
    const small = await run("echo hi", { max_output_bytes: 2000, log_output_bytes: 100_000 });
    expect(small).toMatchObject({ stdout: "hi\n", stdout_bytes: 3, truncated: false });
    expect(small.stdout_log).toBeUndefined();
  });

  it("sends the output live as tagged data frames when asked, and still returns it", async () => {
    const frames: Buffer[] = [];
    const r = await fx.client.request(
      "exec",
      {
        command: "echo one; sleep 0.3; echo two >&2; echo three",
        timeout_ms: 10_000,
        max_output_bytes: 1024,
        stream: true,
      },
      { onData: (c) => frames.push(Buffer.from(c)) },
    );
    const of = (tag: number) =>
      Buffer.concat(frames.filter((f) => f[0] === tag).map((f) => f.subarray(1))).toString();
    expect([of(1), of(2)]).toEqual(["one\nthree\n", "two\n"]);
    expect(r).toMatchObject({ stdout: "one\nthree\n", stderr: "two\n", exit_code: 0 });
  });

  it("feeds the request's upload to the command's stdin, its end being EOF", async () => {
    const r = await fx.client.request(
      "exec",
      { command: "cat; echo end", timeout_ms: 10_000, max_output_bytes: 1024, stdin: true },
      { upload: Readable.from([Buffer.from("piped "), Buffer.from("in\n")]) },
    );
    expect(r.stdout).toBe("piped in\nend\n");
    // A command that reads none of a large stdin still returns, and the connection stays usable.
    const big = Readable.from(
      (function* () {
        for (let i = 0; i < 200; i++) yield Buffer.alloc(64 * 1024, 0x61);
      })(),
    );
    const ignored = await fx.client.request(
      "exec",
      { command: "echo ignored", timeout_ms: 10_000, max_output_bytes: 1024, stdin: true },
      { upload: big },
    );
    expect(ignored.stdout).toBe("ignored\n");
    expect((await run("echo after")).stdout).toBe("after\n");
    // Without stdin the command reads /dev/null.
    expect((await run("cat; echo eof")).stdout).toBe("eof\n");
  });

  it("returns once the shell exits even if a background child keeps the pipes open", async () => {
    const started = Date.now();
    const r = await run("sleep 3 & echo started");
    expect(r.stdout).toBe("started\n");
    expect(Date.now() - started).toBeLessThan(2500);
  });

  it("decodes invalid UTF-8 output lossily instead of failing", async () => {
    const r = await run("printf 'ok\\377\\376end'");
    expect(r.stdout.startsWith("ok")).toBe(true);
    expect(r.stdout.endsWith("end")).toBe(true);
    expect(r.stdout).toContain("\uFFFD");
  });

  it("kills a running command when the host's connection goes away", async () => {
    const running = run("echo $$ > pid; sleep 100", { timeout_ms: 60_000 }).catch((e: AgentError) => e);
    expect(
      await eventually(
        async () => (await readFile(path.join(fx.root, "pid"), "utf8").catch(() => "")) !== "",
      ),
    ).toBe(true);
    const [pid] = await pidsIn("pid");
    fx.client.close();
    expect(((await running) as AgentError).code).toBe("agent_disconnected");
    expect(await eventually(async () => !(await alive(pid!)))).toBe(true);
  });
});
