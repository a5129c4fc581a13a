import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { HostContext } from "../../../src/hosts/host.js";
import { type LaunchCommand, launchCommand, type ServeOptions } from "../../../src/hosts/launch.js";

/** An MCP server over stdio that stands in for `pyro mcp serve` (ignores its args). */
export const FAKE_SERVER = fileURLToPath(new URL("../../helpers/fake-mcp-server.js", import.meta.url));

/** The launch command with the fake server in place of bin/pyro.js. */
export function fakeLaunch(options: ServeOptions = {}): LaunchCommand {
  return launchCommand(options, { binPath: FAKE_SERVER });
}

export interface TempHome {
  dir: string;
  ctx: HostContext;
  cleanup: () => Promise<void>;
}

/**
 * A throwaway HOME with no host CLIs on PATH, so every host works in file mode and
 * nothing touches the real user's config.
 */
export async function tempHome(): Promise<TempHome> {
  const dir = await mkdtemp(join(tmpdir(), "pyro-hosts-"));
  const env: NodeJS.ProcessEnv = { HOME: dir, XDG_CONFIG_HOME: join(dir, ".config"), PATH: "" };
  return {
    dir,
    ctx: { env, home: dir, cwd: dir, timeoutMs: 20_000 },
    cleanup: () => rm(dir, { recursive: true, force: true }),
  };
}
