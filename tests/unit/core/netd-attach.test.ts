import { mkdtemp, rm, stat } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { requestAttach, serveControl } from "../../../src/core/netd-attach.js";
import { PyroError } from "../../../src/errors.js";
import type { NamespaceHolder } from "../../../src/net/netns-listen.js";

let dir: string;
let server: net.Server | null = null;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-ctl-"));
});
afterEach(async () => {
  server?.close();
  server = null;
  await rm(dir, { recursive: true, force: true });
});

it("an attach request reaches the helper with its holder and waits for its answer", async () => {
  const asked: NamespaceHolder[] = [];
  const path = join(dir, "ctl.sock");
  server = await serveControl(path, async (h) => {
    asked.push(h);
    await new Promise((r) => setTimeout(r, 50));
  });
  expect((await stat(path)).mode & 0o777).toBe(0o600);
  await requestAttach(path, { pid: 1234, start_time: "99" });
  expect(asked).toEqual([{ pid: 1234, start_time: "99" }]);
});

it("the helper's failure comes back as the caller's error, with its code", async () => {
  const path = join(dir, "ctl.sock");
  server = await serveControl(path, async () => {
    throw new PyroError("backend_unavailable", "cannot listen on 127.0.0.1:3128 in the sandbox: EADDRINUSE");
  });
  await expect(requestAttach(path, { pid: 1234, start_time: "99" })).rejects.toMatchObject({
    code: "backend_unavailable",
    message: expect.stringContaining("EADDRINUSE"),
  });
});

it("a bad request is answered with an error and attaches nothing; no helper is an error too", async () => {
  const path = join(dir, "ctl.sock");
  let calls = 0;
  server = await serveControl(path, async () => {
    calls++;
  });
  expect(JSON.parse(await rawAnswer(path, '{"attach":{"pid":1,"start_time":5}}\n')).error.code).toBe(
    "invalid_argument",
  );
  const huge = await rawAnswer(path, "x".repeat(5000));
  expect(JSON.parse(huge).error.code).toBe("invalid_argument");
  expect(calls).toBe(0);
  await expect(requestAttach(join(dir, "none.sock"), { pid: 1234, start_time: "1" })).rejects.toMatchObject({
    code: "backend_unavailable",
    message: expect.stringContaining("cannot reach the workspace's network helper"),
  });
});

/** Writes `text` on the control socket as is; what comes back before the helper closes. */
function rawAnswer(path: string, text: string): Promise<string> {
  return new Promise((resolve) => {
    const s = net.connect({ path });
    let got = "";
    s.on("data", (d) => {
      got += d;
    });
    s.on("close", () => resolve(got));
    s.on("error", () => resolve(got));
    s.write(text);
  });
}
