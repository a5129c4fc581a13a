import { describe, expect, it } from "vitest";
import { agentArgv, HOST_NODE } from "../../../src/backends/guest.js";

/**
 * host-compat starts the agent through the same argv helper as every sandbox (issue 12:
 * one agent argv helper), with the host's own node and the package where it is.
 */
describe("the host-compat agent's argv", () => {
  it("is the host's node on the package's agent bundle, serving the workspace directory as /workspace", () => {
    expect(
      agentArgv(
        HOST_NODE,
        { runtime: "", app: "/opt/pyro/" },
        "/h/ws_1/sandbox/workspace",
        { listen: "../sock/agent.sock" },
        { alias: "/workspace", tmp: "/h/ws_1/sandbox/tmp" },
      ),
    ).toEqual([
      process.execPath,
      "/opt/pyro/dist/agent/bundle/main.js",
      "--root",
      "/h/ws_1/sandbox/workspace",
      "--listen",
      "../sock/agent.sock",
      "--tmp",
      "/h/ws_1/sandbox/tmp",
      "--alias",
      "/workspace",
    ]);
  });

  it("serves a stopped workspace read-only over stdio", () => {
    expect(
      agentArgv(
        HOST_NODE,
        { runtime: "", app: "/opt/pyro" },
        "/r",
        { stdio: true },
        {
          readOnly: true,
          alias: "/workspace",
        },
      ),
    ).toEqual([
      process.execPath,
      "/opt/pyro/dist/agent/bundle/main.js",
      "--root",
      "/r",
      "--stdio",
      "--read-only",
      "--alias",
      "/workspace",
    ]);
  });
});
