import { describe, expect, it } from "vitest";
import { run } from "../../../src/util/run.js";

describe("run", () => {
  it("gives the program a pipe (a socket pair) for stdin, never the host's /dev/null (runsc chowns its stdio)", async () => {
    const r = await run(["sh", "-c", "readlink /proc/self/fd/0; cat"]);
    expect(r.stdout).toMatch(/^(pipe|socket):\[\d+\]\n$/);
    const fed = await run(["sh", "-c", "readlink /proc/self/fd/0; cat"], { input: "given" });
    expect(fed.stdout).toMatch(/^(pipe|socket):\[\d+\]\ngiven$/);
  });
});
