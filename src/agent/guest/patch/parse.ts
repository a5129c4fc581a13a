/**
 * Reads the two patch formats `patch_apply` accepts into one shape:
 * - unified diffs (git or plain), with or without hunk line numbers: a bare `@@` (or
 *   `@@ some line`) header, as models often write, has no position and is located by
 *   its context; wrong line counts are tolerated;
 * - the `*** Begin Patch` envelope (the OpenAI/Codex apply_patch format): `*** Add
 *   File:`, `*** Delete File:`, `*** Update File:` with an optional `*** Move to:`, hunks
 *   that start with `@@` optionally followed by a line to find first, and `*** End of
 *   File`.
 */
import { parsePatch, type StructuredPatch, type StructuredPatchHunk } from "diff";
import { AgentError } from "../../errors.js";

/** One line of a hunk: context (' '), removed ('-') or added ('+'). */
export interface HunkLine {
  op: " " | "-" | "+";
  text: string;
  /** Followed by `\ No newline at end of file`. */
  noEol: boolean;
  /** Ended with CRLF in the patch (the line ending it gets in a file that has none yet). */
  cr: boolean;
}

export interface Hunk {
  /** The header as written, for messages: `@@ -3,2 +3,2 @@`, `@@`, `@@ def main():`. */
  header: string;
  /** 0-based index where the header says the old lines start; null for a bare header. */
  oldStart: number | null;
  /** Lines to find, in order, before the hunk's context (`@@ def main():`). */
  anchors: string[];
  /** `*** End of File`: the hunk's old lines end the file. */
  eof: boolean;
  lines: HunkLine[];
}

/** What the patch does to one file. */
export interface FilePatch {
  /** null: the file is added. */
  oldName: string | null;
  /** null: the file is deleted. */
  newName: string | null;
  hunks: Hunk[];
  /** Git `copy from`/`copy to`: the old file stays. */
  copy: boolean;
  /** Git `new mode` / `new file mode`, as permission bits. */
  newMode: number | null;
  binary: boolean;
}

const ENVELOPE_HINT =
  "the envelope format is: *** Begin Patch, then *** Add File: PATH (lines of '+'), *** Delete File: PATH or *** Update File: PATH (optional *** Move to: PATH, then hunks starting with @@ made of ' ', '-', '+' lines), then *** End Patch";

function invalid(message: string, hint?: string): AgentError {
  return new AgentError("invalid_argument", message, hint);
}

/** A line quoted in a message, cut short. */
export function quote(line: string): string {
  const s = line.trim();
  return JSON.stringify(s.length > 60 ? `${s.slice(0, 57)}...` : s);
}

/** Parses a patch in either format. Throws `invalid_argument` on text that is neither. */
export function parsePatchText(text: string): FilePatch[] {
  const raw = text.split("\n");
  // The newline that ends the last line does not start another.
  if (raw.length > 1 && raw.at(-1) === "") raw.pop();
  const lines = raw.map((l) => (l.endsWith("\r") ? l.slice(0, -1) : l));
  const cr = raw.map((l) => l.endsWith("\r"));
  const begin = lines.findIndex((l) => l.trimEnd() === "*** Begin Patch");
  return begin >= 0 ? parseEnvelope(lines, cr, begin) : parseUnified(lines, cr);
}

interface HeaderInfo {
  /** The numbers of `@@ -a,b +c,d @@`, when the header has them. */
  numbers: { oldStart: number; oldCount: number; newStart: number; newCount: number } | null;
  anchor: string | null;
  shown: string;
}

/**
 * `@@ -a,b +c,d @@ ...` has numbers (the text after it is git's function name, only
 * informative). A header without valid numbers is bare; text after a bare `@@` that
 * is not a broken number pair is a line to find first (Codex's `@@ def main():`).
 */
function hunkHeader(line: string): HeaderInfo {
  const shown = line.trim().length > 70 ? `${line.trim().slice(0, 67)}...` : line.trim();
  const m = /^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@/.exec(line);
  if (m) {
    return {
      numbers: {
        oldStart: Number(m[1]),
        oldCount: m[2] === undefined ? 1 : Number(m[2]),
        newStart: Number(m[3]),
        newCount: m[4] === undefined ? 1 : Number(m[4]),
      },
      anchor: null,
      shown,
    };
  }
  const rest = line.slice(2).trim();
  const broken = rest === "" || /^@@/.test(rest) || /^-[\w,]*\s+\+[\w,]*(\s|@@|$)/.test(rest);
  return { numbers: null, anchor: broken ? null : rest, shown };
}

const isBody = (l: string) => l === "" || l[0] === " " || l[0] === "+" || l[0] === "-" || l[0] === "\\";

/**
 * Where the body of the hunk whose header is at `start - 1` ends. Models often write
 * wrong line counts (or none), so the body is what follows the header up to the next
 * header, file header pair or line that cannot be in a hunk (trailing blank lines
 * dropped). The counts decide only when they are consistent and end at such a
 * boundary: then a removed line that looks like a file header (`--- x` followed by
 * `+++ y`) stays in the hunk, as git intends.
 */
function hunkEnd(lines: string[], start: number, numbers: HeaderInfo["numbers"]): number {
  const fileHeaderAt = (j: number) => lines[j]!.startsWith("--- ") && (lines[j + 1] ?? "").startsWith("+++ ");
  const boundary = (j: number) => {
    let k = j;
    while (k < lines.length && lines[k] === "") k++;
    return k === lines.length || lines[k]!.startsWith("@@") || fileHeaderAt(k) || !isBody(lines[k]!);
  };
  let h = start;
  while (h < lines.length && !lines[h]!.startsWith("@@") && isBody(lines[h]!) && !fileHeaderAt(h)) h++;
  while (h > start && lines[h - 1] === "") h--;
  if (!numbers) return h;
  let j = start;
  let o = 0;
  let n = 0;
  while ((o < numbers.oldCount || n < numbers.newCount) && j < lines.length && isBody(lines[j]!)) {
    const c = lines[j]![0] ?? " ";
    if (c === " ") {
      o++;
      n++;
    } else if (c === "-") o++;
    else if (c === "+") n++;
    j++;
  }
  while (j < lines.length && lines[j]!.startsWith("\\")) j++;
  if (o !== numbers.oldCount || n !== numbers.newCount || !boundary(j)) return h;
  // Counted blank lines at the end are as likely a separator as context: drop them.
  while (j > start && lines[j - 1] === "") j--;
  return j;
}

/**
 * Unified diffs. jsdiff's `parsePatch` reads the file headers (git extended headers,
 * quoted names, renames, modes, binary markers) but only hunks with numbers and exact
 * counts: it skips a bare `@@` and its lines without a word, which is how a patch used
 * to "apply" while changing nothing. So every hunk header is first rewritten with the
 * counts of its body (bare ones get placeholder numbers and are remembered as bare).
 */
function parseUnified(lines: string[], cr: boolean[]): FilePatch[] {
  const out: string[] = [];
  // Per hunk: its header and which body lines ended with CRLF (jsdiff's hunk lines are
  // exactly the body lines written below, in order).
  const headers: { header: HeaderInfo; cr: boolean[] }[] = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i]!;
    if (!line.startsWith("@@")) {
      out.push(line);
      i++;
      continue;
    }
    const h = hunkHeader(line);
    const end = hunkEnd(lines, i + 1, h.numbers);
    const body = lines.slice(i + 1, end).map((l) => (l === "" ? " " : l));
    let o = 0;
    let n = 0;
    for (const l of body) {
      if (l[0] === " ") {
        o++;
        n++;
      } else if (l[0] === "-") o++;
      else if (l[0] === "+") n++;
    }
    out.push(`@@ -${h.numbers?.oldStart ?? 1},${o} +${h.numbers?.newStart ?? 1},${n} @@`, ...body);
    headers.push({ header: h, cr: cr.slice(i + 1, end) });
    i = end;
  }
  let parsed: StructuredPatch[];
  try {
    parsed = parsePatch(out.join("\n"));
  } catch (err) {
    throw invalid(`the patch could not be parsed: ${(err as Error).message}`);
  }
  const files: FilePatch[] = [];
  let k = 0;
  for (const fp of parsed) {
    const hunks = fp.hunks.map((h) => toHunk(h, headers[k]!.header, headers[k++]!.cr));
    if (hunks.length === 0 && !fp.oldFileName && !fp.newFileName) continue;
    const { oldName, newName } = fileNames(fp);
    if (oldName === null && newName === null)
      throw invalid(
        "a hunk comes without file headers",
        "start each file with --- a/PATH and +++ b/PATH lines (or use the *** Begin Patch format)",
      );
    const mode = fp.newMode && /^[0-7]+$/.test(fp.newMode) ? Number.parseInt(fp.newMode, 8) & 0o777 : null;
    files.push({
      oldName,
      newName,
      hunks,
      copy: fp.isCopy === true,
      newMode: mode,
      binary: fp.isBinary === true,
    });
  }
  if (k !== headers.length) throw invalid("the patch could not be parsed: a hunk header was not understood");
  return files;
}

function toHunk(h: StructuredPatchHunk, header: HeaderInfo, cr: boolean[]): Hunk {
  const lines: HunkLine[] = [];
  for (const [k, l] of h.lines.entries()) {
    if (l.startsWith("\\")) {
      const prev = lines.at(-1);
      if (prev) prev.noEol = true;
      continue;
    }
    lines.push({ op: l[0] as HunkLine["op"], text: l.slice(1), noEol: false, cr: cr[k] === true });
  }
  return {
    header: header.shown,
    // jsdiff already turned `-N,0` (after line N) into a 1-based start of N+1.
    oldStart: header.numbers ? Math.max(0, h.oldStart - 1) : null,
    anchors: header.anchor === null ? [] : [header.anchor],
    eof: false,
    lines,
  };
}

/**
 * Strips git's `a/` and `b/` prefixes when the patch uses them (git header, or every
 * name carrying its prefix); plain `--- x` / `+++ x` names are kept. `/dev/null` (and
 * git's `new file` / `deleted file` headers) → null.
 */
function fileNames(fp: StructuredPatch): { oldName: string | null; newName: string | null } {
  const raw = (n: string | undefined) => (n === undefined || n === "" || n === "/dev/null" ? null : n);
  const oldRaw = fp.isCreate ? null : raw(fp.oldFileName);
  const newRaw = fp.isDelete ? null : raw(fp.newFileName);
  const prefixed =
    (oldRaw === null || oldRaw.startsWith("a/")) && (newRaw === null || newRaw.startsWith("b/"));
  const strip = fp.isGit || prefixed;
  return {
    oldName: oldRaw !== null && strip && oldRaw.startsWith("a/") ? oldRaw.slice(2) : oldRaw,
    newName: newRaw !== null && strip && newRaw.startsWith("b/") ? newRaw.slice(2) : newRaw,
  };
}

/** The `*** Begin Patch` ... `*** End Patch` envelope. Lines outside it are ignored. */
function parseEnvelope(lines: string[], cr: boolean[], begin: number): FilePatch[] {
  const files: FilePatch[] = [];
  let i = begin + 1;
  const bad = (why: string) => invalid(`line ${i + 1} of the patch: ${why}`, ENVELOPE_HINT);
  const after = (line: string, prefix: string) =>
    line.startsWith(prefix) ? line.slice(prefix.length).trim() : null;
  const plain = (name: string | null, hunks: Hunk[] = []): FilePatch => ({
    oldName: name,
    newName: name,
    hunks,
    copy: false,
    newMode: null,
    binary: false,
  });
  for (;;) {
    if (i >= lines.length) throw bad("the patch ends without *** End Patch");
    const line = lines[i]!;
    if (line.trim() === "*** End Patch") return files;
    if (line.trim() === "") {
      i++;
      continue;
    }
    const added = after(line, "*** Add File:");
    const deleted = after(line, "*** Delete File:");
    const updated = after(line, "*** Update File:");
    if (added) {
      i++;
      const body: HunkLine[] = [];
      while (i < lines.length && !lines[i]!.startsWith("***")) {
        const l = lines[i]!;
        if (l.startsWith("+")) body.push({ op: "+", text: l.slice(1), noEol: false, cr: cr[i]! });
        else if (l.startsWith("\\") && body.length > 0) body.at(-1)!.noEol = true;
        else if (l !== "" || !trailingBlank(lines, i))
          throw bad(`every line of an added file starts with '+'`);
        i++;
      }
      const hunk: Hunk = {
        header: `*** Add File: ${added}`,
        oldStart: 0,
        anchors: [],
        eof: false,
        lines: body,
      };
      files.push({ ...plain(null, body.length > 0 ? [hunk] : []), newName: added });
    } else if (deleted) {
      i++;
      files.push({ ...plain(deleted), newName: null });
    } else if (updated) {
      i++;
      const moveTo = i < lines.length ? after(lines[i]!, "*** Move to:") : null;
      if (moveTo) i++;
      const hunks = envelopeHunks(lines, cr, i, bad);
      i = hunks.next;
      if (hunks.hunks.length === 0 && !moveTo) throw bad(`*** Update File: ${updated} has no hunks`);
      files.push({ ...plain(updated, hunks.hunks), newName: moveTo || updated });
    } else {
      throw bad(
        `expected *** Add File:, *** Delete File:, *** Update File: or *** End Patch, got ${quote(line)}`,
      );
    }
  }
}

/** True when lines[i] and every line after it up to the next `***` line are blank. */
function trailingBlank(lines: string[], i: number): boolean {
  for (let j = i; j < lines.length && !lines[j]!.startsWith("***"); j++)
    if (lines[j]!.trim() !== "") return false;
  return true;
}

/** The hunks of one `*** Update File:`, from `start` up to the next `***` line. */
function envelopeHunks(
  lines: string[],
  cr: boolean[],
  start: number,
  bad: (why: string) => AgentError,
): { hunks: Hunk[]; next: number } {
  const hunks: Hunk[] = [];
  let cur: Hunk | null = null;
  // Blank lines are context, unless they end a hunk (then they only separate).
  let blanks = 0;
  let i = start;
  for (; i < lines.length; i++) {
    const l = lines[i]!;
    if (l.trim() === "*** End of File") {
      if (!cur) throw bad("*** End of File comes outside a hunk");
      cur.eof = true;
      cur = null;
      blanks = 0;
      continue;
    }
    if (l.startsWith("***")) break;
    if (l.startsWith("@@")) {
      const h = hunkHeader(l);
      blanks = 0;
      if (cur && cur.lines.length === 0 && !h.numbers) {
        // Stacked headers (`@@ class A` then `@@ def f():`) narrow the search step by step.
        if (h.anchor !== null) cur.anchors.push(h.anchor);
        cur.header = `${cur.header} ${h.shown}`;
        continue;
      }
      cur = {
        header: h.shown,
        // As jsdiff reads unified headers: `-N,0` means after line N.
        oldStart: h.numbers ? Math.max(0, h.numbers.oldStart - (h.numbers.oldCount === 0 ? 0 : 1)) : null,
        anchors: h.anchor === null ? [] : [h.anchor],
        eof: false,
        lines: [],
      };
      hunks.push(cur);
      continue;
    }
    if (l === "") {
      blanks++;
      continue;
    }
    if (l[0] === "\\") {
      const last = cur?.lines.at(-1);
      if (last) last.noEol = true;
      continue;
    }
    if (l[0] !== " " && l[0] !== "+" && l[0] !== "-")
      throw bad(`a hunk line starts with ' ', '-' or '+', got ${quote(l)}`);
    if (!cur) {
      // Codex lets the first hunk of a file omit its @@ line.
      cur = { header: "@@", oldStart: null, anchors: [], eof: false, lines: [] };
      hunks.push(cur);
    }
    for (; blanks > 0; blanks--) cur.lines.push({ op: " ", text: "", noEol: false, cr: false });
    cur.lines.push({ op: l[0], text: l.slice(1), noEol: false, cr: cr[i]! });
  }
  return { hunks, next: i };
}
