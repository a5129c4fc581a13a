// A stand-in for `pyro mcp serve` in unit tests: speaks MCP over stdio with one tool and
// ignores its arguments. Not the real server: it proves the host plumbing, not pyro.
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";

const server = new McpServer({ name: "fake-pyro", version: "0.0.0" });
server.registerTool("ping", { description: "answers pong" }, async () => ({
  content: [{ type: "text", text: "pong" }],
}));
await server.connect(new StdioServerTransport());
