/**
 * Applies the hunks of one file patch to its text, each hunk located by its context.
 *
 * jsdiff's `applyPatch` is not used for this step: it takes the first place where a
 * hunk fits while scanning outwards from the stated line, so it cannot tell a hunk
 * without line numbers whose context appears twice (which must be refused, not
 * applied at a guess) from one that fits once, cannot say which context line was not
 * found, and only converts line endings for files that are entirely CRLF. The rules
 * here:
 * - a hunk's old lines (context and removed lines) are found in the file after the
 *   previous hunk; exact matches first, then ignoring trailing whitespace;
 * - with a line number, the match nearest the stated line wins (shifted by how far
 *   the previous hunk moved), so wrong numbers are tolerated;
 * - without one (a bare `@@`), the context must be found exactly once; `@@ some line`
 *   first finds that line, and the hunk is the first match after it;
 * - a hunk that only adds lines goes where its line number says, after its `@@` line,
 *   or at the end of the file (as Codex does);
 * - kept lines keep their bytes; added lines take the file's line ending (CRLF files
 *   stay CRLF); `\ No newline at end of file` is honoured, and a file that ends
 *   without a newline keeps it that way unless the patch says otherwise.
 */
import { type Hunk, type HunkLine, quote } from "./parse.js";

/** A hunk that does not apply: which one (1-based) and why. */
export class HunkFailure extends Error {
  constructor(
    readonly index: number,
    readonly hunk: Hunk,
    readonly why: string,
  ) {
    super(why);
  }
}

interface Line {
  /** The line with its terminator, as in the file. */
  raw: string;
  /** The line without `\n` or `\r\n`. */
  text: string;
}

function splitLines(s: string): Line[] {
  const out: Line[] = [];
  let start = 0;
  while (start < s.length) {
    const nl = s.indexOf("\n", start);
    const end = nl === -1 ? s.length : nl + 1;
    const raw = s.slice(start, end);
    out.push({
      raw,
      text: raw.endsWith("\r\n") ? raw.slice(0, -2) : raw.endsWith("\n") ? raw.slice(0, -1) : raw,
    });
    start = end;
  }
  return out;
}

/** Exact, then ignoring trailing whitespace (models often drop or add it). */
const LEVELS: ((a: string, b: string) => boolean)[] = [
  (a, b) => a === b,
  (a, b) => a.trimEnd() === b.trimEnd(),
];

function matchesAt(lines: Line[], old: string[], at: number, eq: (a: string, b: string) => boolean): boolean {
  for (let k = 0; k < old.length; k++) if (!eq(lines[at + k]!.text, old[k]!)) return false;
  return true;
}

/** Positions in [from, to] where `old` matches, at the first level that matches anywhere. */
function findAll(lines: Line[], old: string[], from: number, to: number): number[] {
  for (const eq of LEVELS) {
    const found: number[] = [];
    for (let at = from; at <= to; at++) if (matchesAt(lines, old, at, eq)) found.push(at);
    if (found.length > 0) return found;
  }
  return [];
}

/**
 * Why `old` is not found from `from` on: either it is only found above (hunks out of
 * order), or the first line where the best partial match anywhere in the file stops.
 */
function notFound(lines: Line[], old: string[], from: number, after: string): string {
  const earlier = findAll(lines, old, 0, Math.min(from - 1, lines.length - old.length));
  if (earlier.length > 0)
    return `its context is found only above ${after} (at line ${earlier[0]! + 1}); hunks must follow the file's order`;
  const eq = LEVELS[LEVELS.length - 1]!;
  let best = 0;
  for (let at = 0; at < lines.length && best < old.length; at++) {
    let k = 0;
    while (k < old.length && at + k < lines.length && eq(lines[at + k]!.text, old[k]!)) k++;
    best = Math.max(best, k);
  }
  if (best === 0) return `${quote(old[0]!)} was not found`;
  if (best === old.length) return "its context runs past the end of the file";
  const prev = old[best - 1]!;
  return `${quote(old[best]!)} was not found after ${prev.trim() === "" ? "a blank line" : quote(prev)}`;
}

/** Returns the patched text. Throws HunkFailure naming the first hunk that does not apply. */
export function applyHunks(source: string, hunks: Hunk[]): string {
  const lines = splitLines(source);
  let crlf = 0;
  let lf = 0;
  for (const l of lines) {
    if (l.raw.endsWith("\r\n")) crlf++;
    else if (l.raw.endsWith("\n")) lf++;
  }
  // A file without line endings yet takes each added line's ending from the patch.
  const fileEol = crlf + lf === 0 ? null : crlf > lf ? "\r\n" : "\n";
  const eolOf = (l: HunkLine) => fileEol ?? (l.cr ? "\r\n" : "\n");
  const out: string[] = [];
  let cursor = 0;
  let offset = 0;
  let marked = false;
  for (const [n, hunk] of hunks.entries()) {
    const fail = (why: string) => new HunkFailure(n + 1, hunk, why);
    const old = hunk.lines.filter((l) => l.op !== "+").map((l) => l.text);
    marked ||= hunk.lines.some((l) => l.noEol);
    let from = cursor;
    let after = n === 0 ? "the start" : "the previous hunk";
    for (const anchor of hunk.anchors) {
      const a = anchor.trim();
      let found = -1;
      for (let k = from; k < lines.length && found < 0; k++) if (lines[k]!.text.trim() === a) found = k;
      if (found < 0) throw fail(`${quote(anchor)} was not found${n > 0 ? " below the previous hunk" : ""}`);
      from = found + 1;
      after = quote(anchor);
    }
    let at: number;
    if (old.length === 0) {
      if (hunk.oldStart !== null) at = Math.min(Math.max(hunk.oldStart + offset, from), lines.length);
      else at = hunk.anchors.length > 0 ? from : lines.length;
    } else {
      const last = lines.length - old.length;
      const found = hunk.eof
        ? findAll(lines, old, Math.max(from, last), last)
        : findAll(lines, old, from, last);
      if (found.length === 0)
        throw fail(
          hunk.eof ? "its context is not at the end of the file" : notFound(lines, old, from, after),
        );
      if (found.length === 1 || hunk.anchors.length > 0) at = found[0]!;
      else if (hunk.oldStart !== null) {
        const want = hunk.oldStart + offset;
        at = found.reduce((best, p) => (Math.abs(p - want) < Math.abs(best - want) ? p : best));
      } else {
        const where = found.slice(0, 5).map((p) => p + 1);
        throw fail(
          `its context appears ${found.length} times (at lines ${where.join(", ")}${found.length > 5 ? ", ..." : ""}); add context lines or line numbers so that it matches once`,
        );
      }
    }
    if (hunk.oldStart !== null) offset = at - hunk.oldStart;
    // Trailing context is not consumed: the next hunk may start in it (as in jsdiff).
    for (let k = cursor; k < at; k++) out.push(lines[k]!.raw);
    const produced: string[] = [];
    let j = at;
    let kept = 0;
    let consumed = at;
    for (const l of hunk.lines) {
      if (l.op === " ") produced.push(lines[j++]!.raw);
      else if (l.op === "-") j++;
      else produced.push(l.noEol ? l.text : l.text + eolOf(l));
      if (l.op !== " ") {
        kept = produced.length;
        consumed = j;
      }
    }
    out.push(...produced.slice(0, kept));
    cursor = consumed;
  }
  for (let k = cursor; k < lines.length; k++) out.push(lines[k]!.raw);
  // A line without a newline can only end the file.
  for (let k = 0; k < out.length - 1; k++) if (!out[k]!.endsWith("\n")) out[k] += fileEol ?? "\n";
  let text = out.join("");
  const endedWithout = source !== "" && !source.endsWith("\n");
  if (endedWithout && !marked && text.endsWith("\n")) text = text.slice(0, text.endsWith("\r\n") ? -2 : -1);
  return text;
}
