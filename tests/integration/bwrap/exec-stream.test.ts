import { spawn, spawnSync } from "node:child_process";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PYRO_BIN } from "../../helpers/cli.js";
import { bwrapSkipReason, type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";

/**
 * The CLI connects a command to the terminal (contract §10): `workspace exec` and `run`
 * write its stdout and stderr as they are produced, and pass piped stdin to it.
 */
const skip = bwrapSkipReason();

describe.skipIf(skip !== "")(suiteTitle("live output and piped stdin on bwrap", skip), () => {
  let h: Harness;
  let id: string;
  let env: NodeJS.ProcessEnv;

  beforeAll(async () => {
    h = await openHarness("exec-stream");
    env = { ...process.env, PYRO_DEBUG: "", ...h.cliEnv, PYRO_BACKEND: "bwrap" };
    id = (await h.create()).workspace_id;
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  /** Runs the CLI with `input` on its stdin (a pipe, so not a TTY). */
  const withInput = (args: string[], input: string) =>
    spawnSync(process.execPath, [PYRO_BIN, ...args], { env, input, encoding: "utf8", timeout: 120_000 });

  /** Runs the CLI and notes when each piece of stdout arrived, relative to the start. */
  function timed(args: string[]): Promise<{ code: number | null; chunks: { at: number; text: string }[] }> {
    return new Promise((resolve, reject) => {
      const started = Date.now();
      const child = spawn(process.execPath, [PYRO_BIN, ...args], { env, stdio: ["ignore", "pipe", "pipe"] });
      const chunks: { at: number; text: string }[] = [];
      child.stdout.on("data", (c: Buffer) => chunks.push({ at: Date.now() - started, text: c.toString() }));
      child.on("error", reject);
      child.on("close", (code) => resolve({ code, chunks }));
    });
  }

  it("workspace exec passes piped stdin to the command", () => {
    const r = withInput(["workspace", "exec", id, "--", "cat"], "x\n");
    expect([r.status, r.stdout, r.stderr]).toEqual([0, "x\n", ""]);
    const lines = withInput(["workspace", "exec", id, "--", "wc", "-l"], "a\nb\nc\n");
    expect(lines.stdout.trim()).toBe("3");
  });

  it("workspace exec --json still prints one result object, with the piped stdin read", () => {
    const r = withInput(["workspace", "exec", id, "--json", "--", "sh", "-c", "cat; echo err >&2"], "in\n");
    expect(r.status).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({ stdout: "in\n", stderr: "err\n", exit_code: 0 });
  });

  it("workspace exec writes output as it is produced, stdout and stderr apart", async () => {
    const r = await timed(["workspace", "exec", id, "--", "sh", "-c", "echo first; sleep 3; echo second"]);
    expect(r.code).toBe(0);
    expect(r.chunks.map((c) => c.text).join("")).toBe("first\nsecond\n");
    const first = r.chunks.find((c) => c.text.includes("first"))!;
    const second = r.chunks.find((c) => c.text.includes("second"))!;
    // "first" arrived while the command was still sleeping.
    expect(second.at - first.at).toBeGreaterThan(2000);
    const split = withInput(
      ["workspace", "exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 4"],
      "",
    );
    expect([split.status, split.stdout, split.stderr]).toEqual([4, "out\n", "err\n"]);
  });

  it("a command that does not read its stdin still ends the call", () => {
    const started = Date.now();
    const r = spawnSync(
      "sh",
      ["-c", `yes | "${process.execPath}" "${PYRO_BIN}" workspace exec ${id} -- head -c 4`],
      {
        env,
        encoding: "utf8",
        timeout: 60_000,
      },
    );
    expect([r.status, r.stdout]).toEqual([0, "y\ny\n"]);
    expect(Date.now() - started).toBeLessThan(30_000);
  });

  it("run passes piped stdin and streams its output too", async () => {
    const r = withInput(["run", "debian:12", "--", "cat"], "one-shot\n");
    expect([r.status, r.stdout]).toEqual([0, "one-shot\n"]);
    const t = await timed(["run", "debian:12", "--", "sh", "-c", "echo first; sleep 3; echo second"]);
    expect(t.code).toBe(0);
    const first = t.chunks.find((c) => c.text.includes("first"))!;
    const second = t.chunks.find((c) => c.text.includes("second"))!;
    expect(second.at - first.at).toBeGreaterThan(2000);
  });
});
