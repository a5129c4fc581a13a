/**
 * What the guest shows of its setup helper when the helper's port did not answer
 * (setup-port.ts): asked through the agent, which still answers then, so that a hang
 * explains itself in the error instead of needing a reproduction. Read-only and bounded.
 */
import type { Duplex } from "node:stream";
import { AgentClient } from "../../agent/client.js";
import { GUEST, SETUP_HELPER } from "../vm/types.js";

/**
 * Shell for the guest (its own busybox: the environment's tools are unknown): each
 * running `--serve` helper's pid, state, wait channel, open files and kernel stack,
 * whether its unix socket is there, and the virtio-serial ports by name.
 */
export const HELPER_PROBE = `B=${GUEST.agentDir}/bin/busybox
n=0
for d in /proc/[0-9]*; do
  case "$($B tr '\\0' ' ' < $d/cmdline 2>/dev/null)" in *${SETUP_HELPER}\\ --serve*) ;; *) continue ;; esac
  n=$((n + 1))
  echo "helper \${d#/proc/}: state $($B cut -d' ' -f3 $d/stat) wchan $($B cat $d/wchan 2>/dev/null)" \\
    "fds $(for f in $d/fd/*; do $B readlink $f; done | $B tr '\\n' ' ')" \\
    "stack $($B head -n 4 $d/stack 2>/dev/null | $B cut -d' ' -f2 | $B tr '\\n' ' ')"
done
[ $n = 0 ] && echo "no ${SETUP_HELPER} server running"
[ -S ${GUEST.setupSocket} ] || echo "no ${GUEST.setupSocket}"
printf 'ports:'
for e in /sys/class/virtio-ports/*; do [ -e "$e" ] && printf ' %s=%s' "\${e##*/}" "$($B cat $e/name 2>/dev/null)"; done
echo`;

/** Guest text as shown in an error: printable, one line, bounded. */
function shown(text: string, max: number): string {
  return text
    .replace(/\s+/g, " ")
    .replace(/[^\x20-\x7e]/g, "?")
    .trim()
    .slice(0, max);
}

/**
 * The guest's view of its setup helper (HELPER_PROBE's output), or why it could not be
 * had. Never throws: it only adds to an error being reported.
 */
export async function describeSetupHelper(
  connect: () => Promise<Duplex>,
  timeoutMs = 15_000,
): Promise<string> {
  try {
    const client = await AgentClient.connect(await connect(), { timeoutMs });
    try {
      const r = await client.request("exec", {
        command: HELPER_PROBE,
        timeout_ms: timeoutMs,
        max_output_bytes: 4096,
      });
      return shown(`${r.stdout} ${r.stderr}`, 1000) || "(nothing)";
    } finally {
      client.close();
    }
  } catch (err) {
    return `(the agent could not be asked: ${shown((err as Error).message, 200)})`;
  }
}
