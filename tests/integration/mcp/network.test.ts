import { LoggingMessageNotificationSchema } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bwrapSkipReason, type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";
import { launchStdio, type StdioServer } from "./helpers.js";

/**
 * Network over MCP as a host uses it: `pyro mcp serve --profile workspace-full` over
 * stdio, a bwrap workspace created with a policy and a published port, a refused
 * destination listed by workspace_network_blocks, and no way for the model to approve it.
 */
const skip = bwrapSkipReason();

describe.skipIf(skip !== "")(
  suiteTitle("network policies and published ports over MCP, on bwrap", skip),
  () => {
    let h: Harness;
    let server: StdioServer;

    beforeAll(async () => {
      h = await openHarness("mcp-network");
      server = await launchStdio({
        cwd: await h.tempDir("cwd"),
        env: h.cliEnv,
        args: ["--profile", "workspace-full"],
      });
    });
    afterAll(async () => {
      await server?.close();
      await h?.cleanup();
    });

    it("creates with egress and a published port, lists a refused destination, and offers no approval tool", async () => {
      const w = await server.ok("workspace_create", {
        backend: "bwrap",
        network_policy: "egress",
        published_ports: [{ host_port: 0, guest_port: 18082 }],
      });
      expect(w.network_policy).toBe("egress");
      const hostPort = w.published_ports[0].host_port;
      expect(hostPort).toBeGreaterThan(0);
      await server.ok("workspace_file_write", {
        workspace_id: w.workspace_id,
        path: "srv.js",
        text: `require("http").createServer((q, r) => r.end("mcp " + q.url)).listen(18082, "127.0.0.1")`,
      });
      const warnings: string[] = [];
      server.client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
        if (n.params.level === "warning") warnings.push((n.params.data as { message: string }).message);
      });
      // The server inside, the proxy's answer to a name that resolves to this machine.
      const r = await server.ok("workspace_exec", {
        workspace_id: w.workspace_id,
        command:
          "setsid -f /run/pyro/runtime/bin/node srv.js >/dev/null 2>&1; " +
          "bash -c 'for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/18082) 2>/dev/null && break; sleep 0.1; done; " +
          'exec 3<>/dev/tcp/127.0.0.1/3128; printf "GET http://localhost:9/ HTTP/1.0\\r\\n\\r\\n" >&3; head -1 <&3\'; echo "$HTTP_PROXY"',
      });
      expect(r.stdout).toBe("HTTP/1.1 403 Forbidden\r\nhttp://127.0.0.1:3128\n");
      expect(await fetch(`http://127.0.0.1:${hostPort}/x`).then((res) => res.text())).toBe("mcp /x");
      const blocks = await server.ok("workspace_network_blocks", { workspace_id: w.workspace_id });
      expect(blocks).toMatchObject({ network_policy: "egress", count: 1 });
      expect(blocks.blocks[0]).toMatchObject({ kind: "network", target: "localhost:9", count: 1 });
      expect(blocks.blocks[0].reason).toMatch(/loopback/);
      // A person watching the host is told, with the command that would approve it.
      expect(warnings).toContainEqual(
        expect.stringMatching(
          new RegExp(
            `network policy egress refused localhost:9 .*pyro workspace network approve ${w.workspace_id} localhost:9`,
          ),
        ),
      );
      // Approval is the user's: no tool for it, and workspace_update does not take a policy.
      const tools = (await server.client.listTools()).tools.map((t) => t.name);
      expect(tools).toContain("workspace_network_blocks");
      expect(tools.filter((t) => /approve/.test(t))).toEqual([]);
      const update = await server.call("workspace_update", {
        workspace_id: w.workspace_id,
        network_policy: "off",
      });
      expect(update.isError).toBe(true);
      await server.ok("workspace_delete", { workspace_id: w.workspace_id });
      expect(
        await fetch(`http://127.0.0.1:${hostPort}/x`).then(
          () => "open",
          () => "refused",
        ),
      ).toBe("refused");
    });
  },
);
