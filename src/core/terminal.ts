/**
 * Terminal output as a person would see it (contract §6 "plain" shell reads): the raw
 * bytes go through a headless xterm (@xterm/headless, the terminal emulator VS Code
 * uses) and come out as the screen's text, so colours, cursor movement, `\r` progress
 * bars and full-screen programs leave text, not control sequences.
 */
// Imported on first use: one large CommonJS file (~40 ms of loading) that only plain
// shell reads need, not every process that loads the core.
type Xterm = typeof import("@xterm/headless");
let xtermModule: Promise<Xterm> | undefined;

/** Lines of scrollback the renderer keeps (a read is at most 1 MiB). */
const SCROLLBACK = 100_000;

/**
 * Renders `output` as text. `prefix` is what the terminal printed before it (fed first,
 * not returned) so the state `output` starts in (colours, a half-printed line, an
 * alternate screen) is right. Returns the lines from the one the cursor was on when
 * `output` began, wrapped lines joined, trailing blanks trimmed; when a full-screen
 * program holds the terminal at the end, its screen.
 */
export async function renderPlain(
  prefix: string,
  output: string,
  cols: number,
  rows: number,
): Promise<string> {
  if (output === "") return "";
  xtermModule ??= import("@xterm/headless").then((m) => (m as { default?: Xterm }).default ?? m);
  const xterm = await xtermModule;
  const term = new xterm.Terminal({ cols, rows, scrollback: SCROLLBACK, allowProposedApi: true });
  try {
    const write = (data: string) => new Promise<void>((resolve) => term.write(data, resolve));
    if (prefix !== "") await write(prefix);
    const marker = term.registerMarker(0);
    await write(output);
    const buf = term.buffer.active;
    const first = buf.type === "alternate" ? 0 : marker && !marker.isDisposed ? Math.max(0, marker.line) : 0;
    const lines: string[] = [];
    for (let i = first; i < buf.length; i++) {
      const line = buf.getLine(i);
      if (!line) continue;
      const text = line.translateToString(true);
      if (line.isWrapped && lines.length > 0) lines[lines.length - 1] += text;
      else lines.push(text);
    }
    while (lines.length > 0 && lines[lines.length - 1] === "") lines.pop();
    return lines.join("\n");
  } finally {
    term.dispose();
  }
}
