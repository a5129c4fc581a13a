/**
 * Entry point of the guest agent, run inside the sandbox:
 *
 *   node dist/agent/guest/main.js --root /workspace --listen /run/pyro/agent.sock
 *   node dist/agent/guest/main.js --root /workspace --stdio
 *
 * Nothing is ever written to stdout except protocol frames (in --stdio mode it is the
 * channel). Debug logs go to stderr when PYRO_AGENT_DEBUG is set; a fatal start-up
 * error is one line on stderr and exit code 2.
 */
import { parseGuestArgs, startGuest } from "./agent.js";

// Node opens its inspector (127.0.0.1:9229, in the sandbox's network) on SIGUSR1, which
// any command running as the agent's uid may send: through it, a command would run code
// in the agent, which outlives an in-place reset (backends/bwrap/reset.ts). A listener of
// its own takes the signal from Node's handler (node 20 has no --disable-sigusr1).
process.on("SIGUSR1", () => {});

async function main(): Promise<void> {
  let handle: Awaited<ReturnType<typeof startGuest>>;
  try {
    handle = await startGuest(parseGuestArgs(process.argv.slice(2)));
  } catch (err) {
    process.stderr.write(`pyro-agent: ${(err as Error).message}\n`);
    process.exit(2);
  }
  const stop = () => {
    void handle.close().finally(() => process.exit(0));
  };
  process.once("SIGTERM", stop);
  process.once("SIGINT", stop);
  await handle.done;
  process.exit(0);
}

void main();
