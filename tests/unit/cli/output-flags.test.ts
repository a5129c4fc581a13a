import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PassThrough } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { main } from "../../../src/cli/main.js";

let home: string;
beforeAll(async () => {
  home = await mkdtemp(join(tmpdir(), "pyro-cli-flags-"));
});
afterAll(() => rm(home, { recursive: true, force: true }));

async function cli(args: string[]) {
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  stdout.on("data", (c) => out.push(c));
  stderr.on("data", (c) => err.push(c));
  const code = await main(["node", "pyro", ...args], {
    stdout,
    stderr,
    stderrIsTTY: false,
    env: { PYRO_HOME: home, PATH: process.env.PATH ?? "" },
  });
  return { code, stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString() };
}

describe("--max-output-bytes", () => {
  it("is refused with one invalid_argument line when it is not a size from 1 KiB to 4 MiB", async () => {
    for (const cmd of [
      ["workspace", "exec", "ws_000000000000"],
      ["run", "debian:12"],
    ]) {
      for (const bad of ["abc", "-1", "10", "5m"]) {
        const r = await cli([...cmd, "--max-output-bytes", bad, "--", "true"]);
        expect(r.code, `${cmd.join(" ")} ${bad}`).toBe(1);
        expect(r.stderr).toMatch(/^pyro: error \[invalid_argument\]: --max-output-bytes .*\n$/);
        expect(r.stderr.split("\n")).toHaveLength(2);
        expect(r.stdout).toBe("");
      }
    }
  });

  it("is refused as a JSON error object under --json", async () => {
    const r = await cli([
      "workspace",
      "exec",
      "ws_000000000000",
      "--json",
      "--max-output-bytes",
      "x",
      "--",
      "true",
    ]);
    expect(r.code).toBe(1);
    expect(JSON.parse(r.stdout).error.code).toBe("invalid_argument");
  });

  it("is refused for logs --seq that is not a command number", async () => {
    const r = await cli(["workspace", "logs", "ws_000000000000", "--seq", "x"]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^pyro: error \[invalid_argument\]: --seq /);
  });
});
