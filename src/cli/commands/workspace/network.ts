import type { Command } from "commander";
import type { CliContext } from "../../main.js";
import { act, table } from "../../output.js";

/**
 * `pyro workspace network blocks|approve`: the capability blocks of a workspace's egress
 * proxy, and a human's approval of one (docs/network.md). Approval is here and in the
 * SDK only, never an MCP tool: a model must not approve its own egress.
 */
export function registerNetwork(ws: Command, ctx: CliContext): void {
  const net = ws.command("network").description("a workspace's refused destinations, and approving one");
  net
    .command("blocks")
    .description("list the destinations the workspace's egress proxy refused")
    .argument("<id>", "workspace id or name")
    .option("--json", "print the structured result")
    .action(async (id: string, o: { json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => ctx.engine().workspaces.networkBlocks(id),
        (r) =>
          r.count === 0
            ? `no blocks (network ${r.network_policy})`
            : table(
                ["target", "count", "last", "reason"],
                r.blocks.map((b) => [b.target, String(b.count), b.last_at, b.reason]),
              ),
      );
    });
  net
    .command("approve")
    .description("allow a destination (HOST[:PORT]) from now on, on the running workspace")
    .argument("<id>", "workspace id or name")
    .argument("<target>", "HOST[:PORT] as `network blocks` lists it")
    .option("--json", "print the structured result")
    .action(async (id: string, target: string, o: { json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => ctx.engine().workspaces.approveNetwork(id, target),
        (r) => `approved ${r.target} for ${r.workspace_id} (network ${r.network_policy})`,
      );
    });
}
