import { spawn } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { PYRO_BIN } from "../helpers/cli.js";

/**
 * `pyro mcp serve` on stdio ends when its host closes stdin, even when something in the
 * process still holds the event loop (here a listening socket made by a preload, standing
 * in for a leaked connection): its watchdog names what was open and exits. Without the
 * watchdog the process never ends and this test times out.
 */
let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-mcp-exit-"));
  await writeFile(join(dir, "hold.cjs"), 'require("node:net").createServer().listen(0, "127.0.0.1");\n');
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

function serve(env: NodeJS.ProcessEnv): Promise<{ code: number | null; stderr: string; ms: number }> {
  return new Promise((resolve) => {
    const t = performance.now();
    const child = spawn(process.execPath, [PYRO_BIN, "mcp", "serve"], {
      cwd: dir,
      env: { ...process.env, PYRO_HOME: join(dir, "home"), PYRO_POOL: "0", ...env },
      stdio: ["pipe", "pipe", "pipe"],
    });
    let stderr = "";
    child.stderr.on("data", (d: Buffer) => {
      stderr += d.toString("utf8");
    });
    child.stdout.resume();
    child.on("exit", (code) => resolve({ code, stderr, ms: performance.now() - t }));
    child.stdin.end();
  });
}

it("ends on its own after stdin closes when nothing is left open", { timeout: 60_000 }, async () => {
  const r = await serve({});
  expect(r.code).toBe(0);
  expect(r.stderr).not.toContain("still running");
});

it("ends within its grace and names what held it when something is left open", {
  timeout: 60_000,
}, async () => {
  const r = await serve({ NODE_OPTIONS: `--require ${join(dir, "hold.cjs")}` });
  expect(r.stderr).toMatch(
    /pyro mcp: still running 20 s after the host closed stdin; ending it \(still open: .*TCPServerWrap/,
  );
  expect(r.code).toBe(0);
});
