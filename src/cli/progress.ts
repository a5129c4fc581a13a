import type { BuildProgress } from "../core/vocabulary.js";
import { formatBytes } from "../util/fs.js";
import type { Io } from "./output.js";

/**
 * A one-line progress display for long work (environment builds) on a TTY. Off a TTY it
 * prints nothing, so logs and --json output stay clean.
 */
export function progressReporter(
  io: Io,
  label: string,
): { update: (p: BuildProgress) => void; done: () => void } {
  if (!io.stderrIsTTY) return { update: () => {}, done: () => {} };
  const started = Date.now();
  let last = 0;
  let shown = false;
  const update = (p: BuildProgress) => {
    const now = Date.now();
    if (now - last < 100 && p.phase !== "done") return;
    last = now;
    const secs = ((now - started) / 1000).toFixed(0);
    const parts = [`${label}: ${p.phase}`];
    if (p.count) parts.push(`${p.count} pkgs`);
    if (p.total_count)
      parts.push(`${p.done_count ?? 0}/${p.total_count} ${p.phase === "step" ? "steps" : "layers"}`);
    if (p.bytes && p.total_bytes) {
      const rate = p.bytes / Math.max(0.001, (now - started) / 1000);
      parts.push(`${formatBytes(p.bytes)}/${formatBytes(p.total_bytes)} ${formatBytes(rate)}/s`);
    } else if (p.bytes) parts.push(formatBytes(p.bytes));
    parts.push(`${secs}s`);
    const msg = p.message ? ` ${p.message}` : "";
    const cols = (io.stderr as NodeJS.WriteStream).columns ?? 100;
    const text = `${parts.join(" | ")}${msg}`.slice(0, Math.max(20, cols - 1));
    io.stderr.write(`\r\x1b[2K${text}`);
    shown = true;
  };
  return {
    update,
    done: () => {
      if (shown) io.stderr.write("\r\x1b[2K");
    },
  };
}
