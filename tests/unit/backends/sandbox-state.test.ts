import { describe, expect, it } from "vitest";
import { z } from "zod";
import { socketSandboxShape, stateReader } from "../../../src/backends/sandbox-state.js";
import { PyroError } from "../../../src/errors.js";

const R = stateReader("bwrap", { ...socketSandboxShape, extra: z.string() });
const whole = {
  backend: "bwrap" as const,
  pid: 42,
  start_time: "123",
  socket: "/s/agent.sock",
  log: "/l",
  cgroup: "ws_1",
  extra: "x",
};

describe("typed sandbox state", () => {
  it("reads a whole state, keeping fields it does not know", () => {
    expect(R.read({ ...whole, later: 1 })).toMatchObject({ pid: 42, socket: "/s/agent.sock", later: 1 });
  });

  it("refuses an incomplete or mistyped state with an internal error naming the fields", () => {
    const err = (() => {
      try {
        R.read({ backend: "bwrap", pid: "42", socket: "/s" });
      } catch (e) {
        return e;
      }
    })();
    expect(err).toBeInstanceOf(PyroError);
    expect((err as PyroError).code).toBe("internal");
    expect((err as PyroError).message).toMatch(/bwrap sandbox state is incomplete \(pid, start_time/);
  });

  it("reads what is valid of a partial state, for cleanup", () => {
    expect(R.readPartial({ backend: "bwrap", pid: 7, start_time: 5, cgroup: "ws_2" })).toEqual({
      pid: 7,
      cgroup: "ws_2",
    });
  });
});

describe("host-compat's recorded state", () => {
  it("is read typed: an incomplete one is refused as internal, not connected to as a path", async () => {
    const { HostBackend } = await import("../../../src/backends/host/backend.js");
    const host = new HostBackend();
    await expect(host.connect({ backend: "host", pid: 1, start_time: "" })).rejects.toMatchObject({
      code: "internal",
      message: expect.stringMatching(/host sandbox state is incomplete \(socket/),
    });
    // Cleanup reads what is there: no pid, nothing to stop and nothing running.
    await expect(host.isRunning({ backend: "host", socket: "/s" })).resolves.toBe(false);
    await expect(host.stop({ backend: "host", pid: "7" })).resolves.toBeUndefined();
  });
});
