import { randomBytes } from "node:crypto";
import type { Duplex } from "node:stream";
import { AgentClient } from "../../agent/client.js";

/**
 * After a VM starts (cold boot or restored from a snapshot): connects to the agent, hands
 * it the host's clock and fresh entropy (restored clones share the template's RNG state
 * and clock), and has it mount /workspace over the seed disk. Resolves with the guest's
 * kernel release, and how long the agent took to answer at all, once /workspace is ready.
 */
export async function setupGuest(
  connect: () => Promise<Duplex>,
  options: { timeoutMs: number; hostname?: string; signal?: AbortSignal },
): Promise<{ kernel: string; answered_ms: number; guest_ms: number; shell_ms: number }> {
  const started = performance.now();
  // The boot wait is the longest of a start (minutes for a cold boot under emulation): a
  // cancelled start must not sit it out.
  const client = await AgentClient.connect(await connect(), {
    timeoutMs: options.timeoutMs,
    ...(options.signal ? { signal: options.signal } : {}),
  });
  const answered_ms = Math.round(performance.now() - started);
  try {
    const r = await client.request(
      "vm_setup",
      {
        time_ms: Date.now(),
        entropy: randomBytes(64).toString("base64"),
        hostname: options.hostname ?? "pyro",
      },
      { timeoutMs: 60_000, ...(options.signal ? { signal: options.signal } : {}) },
    );
    return { kernel: r.kernel, answered_ms, guest_ms: r.duration_ms, shell_ms: r.shell_ms };
  } finally {
    await client.close();
  }
}
