import type { PrintedConfig } from "./host.js";
import type { LaunchCommand } from "./launch.js";

/**
 * Any other MCP client (Claude Desktop, Cursor, Windsurf, Cline, ...): the common
 * `mcpServers` JSON with `command` and `args`. pyro only prints it; where it goes is the
 * client's business.
 */
export function genericConfig(launch: LaunchCommand): PrintedConfig {
  return {
    host: "generic",
    server_name: launch.server_name,
    command: launch.command,
    args: launch.args,
    format: "json",
    config_location: "the client's MCP config file, under `mcpServers`",
    snippet: JSON.stringify(
      { mcpServers: { [launch.server_name]: { command: launch.command, args: launch.args } } },
      null,
      2,
    ),
    cli_command: null,
  };
}
