import { isDeepStrictEqual } from "node:util";
import {
  createScanner,
  type Node,
  type ParseError,
  parse,
  parseTree,
  printParseErrorCode,
  SyntaxKind,
} from "jsonc-parser";
import { PyroError } from "../errors.js";
import { isObject, type JsonObject, jsonIndent, type LoadedFile, readText } from "./files.js";

/**
 * Editing one member of a JSON or JSONC config (OpenCode's `opencode.json[c]`, Claude
 * Code's `~/.claude.json`) as text: jsonc-parser finds where things are, and pyro
 * splices only the bytes of its own member. Comments, trailing commas, key order and
 * formatting elsewhere stay as they were; the result is parsed again and refused
 * (`conflict`, nothing written) unless everything but pyro's member, comments included,
 * is what it was.
 */

const PARSE = { allowTrailingComma: true, disallowComments: false };

/** Parses JSONC (comments and trailing commas allowed); `error` names the first fault. */
export function parseJsonc(text: string): { data: JsonObject; error?: string } {
  if (text.trim() === "") return { data: {} };
  const errors: ParseError[] = [];
  const data: unknown = parse(text, errors, PARSE);
  const first = errors[0];
  if (first) {
    const { line, column } = lineColumn(text, first.offset);
    return { data: {}, error: `${printParseErrorCode(first.error)} at line ${line} column ${column}` };
  }
  if (!isObject(data)) return { data: {}, error: "the top level is not a JSON object" };
  return { data };
}

/** Reads a JSONC config; a missing file is an empty document, a broken one has `error`. */
export async function loadJsonc(path: string): Promise<LoadedFile<JsonObject>> {
  const text = await readText(path);
  if (text === null) return { path, exists: false, text: "", data: {} };
  return { path, exists: true, text, ...parseJsonc(text) };
}

function lineColumn(text: string, offset: number): { line: number; column: number } {
  const before = text.slice(0, offset);
  const nl = before.lastIndexOf("\n");
  return { line: before.split("\n").length, column: offset - nl };
}

interface Edit {
  offset: number;
  length: number;
  content: string;
}

function applyEdits(text: string, edits: Edit[]): string {
  let out = text;
  for (const e of [...edits].sort((a, b) => b.offset - a.offset))
    out = out.slice(0, e.offset) + e.content + out.slice(e.offset + e.length);
  return out;
}

/**
 * Sets the member at `path` (e.g. `["mcp", "pyro"]`) to `value`, or removes it when
 * `value` is undefined; parents that do not exist are created. A blank document becomes
 * `newDocument` with the member set. Throws `conflict` when the edit cannot be proven
 * to have touched nothing else.
 */
export function setJsonMember(
  text: string,
  path: readonly string[],
  value: unknown,
  options: { newDocument?: JsonObject; hint?: string } = {},
): string {
  if (text.trim() === "") {
    if (value === undefined) return text;
    return `${JSON.stringify(withMember(options.newDocument ?? {}, path, value), null, 2)}\n`;
  }
  try {
    const root = parseTree(text, [], PARSE);
    if (root?.type !== "object") throw unsafe("the top level is not a JSON object");
    const edits =
      value === undefined ? removeEdits(text, root, path) : setEdits(text, root, path, value, styleOf(text));
    const next = applyEdits(text, edits);
    verify(text, next, path, value);
    return next;
  } catch (err) {
    if (err instanceof PyroError && options.hint) throw new PyroError(err.code, err.message, options.hint);
    throw err;
  }
}

function withMember(doc: JsonObject, path: readonly string[], value: unknown): JsonObject {
  const [head, ...rest] = path;
  if (head === undefined) return doc;
  const child = isObject(doc[head]) ? doc[head] : {};
  return { ...doc, [head]: rest.length === 0 ? value : withMember(child, rest, value) };
}

interface Style {
  unit: string;
  eol: string;
}

function styleOf(text: string): Style {
  const indent = jsonIndent(text);
  return {
    unit: typeof indent === "number" ? " ".repeat(indent) : indent,
    eol: text.includes("\r\n") ? "\r\n" : "\n",
  };
}

function member(obj: Node, key: string): Node | undefined {
  return obj.children?.find((p) => p.children?.[0]?.value === key);
}

/** The whitespace a line starts with, when only whitespace precedes `offset` on it. */
function lineIndent(text: string, offset: number): string | null {
  const start = text.lastIndexOf("\n", offset - 1) + 1;
  const lead = text.slice(start, offset);
  return /^[ \t]*$/.test(lead) ? lead : null;
}

/** The whitespace that starts the line holding `offset`. */
function leadingWhitespace(text: string, offset: number): string {
  return /^[ \t]*/.exec(text.slice(text.lastIndexOf("\n", offset - 1) + 1))?.[0] ?? "";
}

/** `value` as JSON text whose continuation lines sit at `indent`. */
function render(value: unknown, indent: string, style: Style): string {
  return JSON.stringify(value, null, style.unit).split("\n").join(`${style.eol}${indent}`);
}

/** The next token after `offset` that is not whitespace or a comment. */
function nextToken(text: string, offset: number): { kind: SyntaxKind; offset: number } {
  const s = createScanner(text, true);
  s.setPosition(offset);
  const kind = s.scan();
  return { kind, offset: s.getTokenOffset() };
}

function setEdits(text: string, root: Node, path: readonly string[], value: unknown, style: Style): Edit[] {
  let obj = root;
  for (let i = 0; i < path.length; i++) {
    const key = path[i] as string;
    const prop = member(obj, key);
    const rest = path.slice(i + 1);
    const wanted = rest.length === 0 ? value : withMember({}, rest, value);
    if (!prop) return insertEdits(text, obj, key, wanted, style);
    const node = prop.children?.[1];
    if (!node) throw unsafe(`'${path.slice(0, i + 1).join(".")}' has no value`);
    if (rest.length === 0 || node.type !== "object") {
      if (rest.length > 0) throw unsafe(`'${path.slice(0, i + 1).join(".")}' is not an object`);
      const content = render(value, leadingWhitespace(text, prop.offset), style);
      return [{ offset: node.offset, length: node.length, content }];
    }
    obj = node;
  }
  return [];
}

/**
 * Adds `"key": value` as the object's last member, after any comment that trails the
 * current last member (so that comment stays on its own member's line), keeping the
 * object's trailing-comma habit.
 */
function insertEdits(text: string, obj: Node, key: string, value: unknown, style: Style): Edit[] {
  const open = obj.offset;
  const close = obj.offset + obj.length - 1;
  const props = obj.children ?? [];
  const inner = text.slice(open + 1, close);
  const closeIndent = lineIndent(text, close);
  if (props.length === 0 && inner.trim() === "" && text.includes("\n")) {
    // `"mcp": {}` in a multi-line file: open it up like the rest of the file.
    const lead = leadingWhitespace(text, open);
    const entry = `${JSON.stringify(key)}: ${render(value, lead + style.unit, style)}`;
    return [
      {
        offset: open + 1,
        length: inner.length,
        content: `${style.eol}${lead}${style.unit}${entry}${style.eol}${lead}`,
      },
    ];
  }
  if (!inner.includes("\n") || closeIndent === null) {
    // A one-line object: grow it in place, `{"a": 1}` -> `{"a": 1, "key": value}`.
    const last = props[props.length - 1];
    const entry = `${JSON.stringify(key)}: ${JSON.stringify(value)}`;
    if (!last) return [{ offset: open + 1, length: close - open - 1, content: entry }];
    const end = last.offset + last.length;
    const comma = nextToken(text, end).kind === SyntaxKind.CommaToken;
    return [{ offset: end, length: 0, content: comma ? ` ${entry},` : `, ${entry}` }];
  }
  const first = props[0];
  const indent = (first && lineIndent(text, first.offset)) || closeIndent + style.unit;
  let at = close;
  while (at > open + 1 && /\s/.test(text[at - 1] ?? "")) at--;
  const entry = `${style.eol}${indent}${JSON.stringify(key)}: ${render(value, indent, style)}`;
  const last = props[props.length - 1];
  if (!last) return [{ offset: at, length: 0, content: entry }];
  const end = last.offset + last.length;
  const trailingComma = nextToken(text, end).kind === SyntaxKind.CommaToken;
  const edits: Edit[] = [{ offset: at, length: 0, content: trailingComma ? `${entry},` : entry }];
  if (!trailingComma) edits.push({ offset: end, length: 0, content: "," });
  return edits;
}

/**
 * The bytes a member owns: its lines when it sits on lines of its own (with its comma
 * and a comment at the end of its last line), else just its text and comma.
 */
function ownSpan(text: string, prop: Node): { start: number; end: number; hasComma: boolean } {
  const end = prop.offset + prop.length;
  const after = nextToken(text, end);
  const hasComma = after.kind === SyntaxKind.CommaToken;
  const stop = hasComma ? after.offset + 1 : end;
  const rest = /^[ \t]*(\/\/[^\r\n]*)?(\r?\n|$)/.exec(text.slice(stop));
  if (lineIndent(text, prop.offset) !== null && rest)
    return { start: text.lastIndexOf("\n", prop.offset - 1) + 1, end: stop + rest[0].length, hasComma };
  const spaces = hasComma ? (/^[ \t]*/.exec(text.slice(stop))?.[0].length ?? 0) : 0;
  return { start: prop.offset, end: stop + spaces, hasComma };
}

/** The member at `path` with the object holding it, when both are there. */
function locate(root: Node | undefined, path: readonly string[]): { obj: Node; index: number } | null {
  let obj = root;
  for (const key of path.slice(0, -1)) {
    const value = obj ? member(obj, key)?.children?.[1] : undefined;
    if (value?.type !== "object") return null;
    obj = value;
  }
  const index = obj?.children?.findIndex((p) => p.children?.[0]?.value === path[path.length - 1]) ?? -1;
  return obj && index >= 0 ? { obj, index } : null;
}

/** Removes the member at `path` and the bytes it owns; nothing when it is not there. */
function removeEdits(text: string, root: Node, path: readonly string[]): Edit[] {
  const at = locate(root, path);
  const props = at?.obj.children ?? [];
  const prop = at ? props[at.index] : undefined;
  if (!at || !prop) return [];
  const span = ownSpan(text, prop);
  const prev = props[at.index - 1];
  const comma = prev && !span.hasComma ? nextToken(text, prev.offset + prev.length) : null;
  if (comma?.kind !== SyntaxKind.CommaToken)
    return [{ offset: span.start, length: span.end - span.start, content: "" }];
  // It was the last member: the comma before it would now end the object, so it goes
  // too (on one line, with the space between: `{"a": 1, "pyro": 2}` -> `{"a": 1}`).
  if (span.start === prop.offset)
    return [{ offset: comma.offset, length: span.end - comma.offset, content: "" }];
  return [
    { offset: span.start, length: span.end - span.start, content: "" },
    { offset: comma.offset, length: 1, content: "" },
  ];
}

/** Comments in `text`, except those among the bytes the member at `path` owns. */
function commentsOutside(text: string, path: readonly string[]): string[] {
  const at = locate(parseTree(text, [], PARSE), path);
  const prop = at?.obj.children?.[at.index];
  const span = prop ? ownSpan(text, prop) : { start: 0, end: 0 };
  const s = createScanner(text, false);
  const out: string[] = [];
  for (let k = s.scan(); k !== SyntaxKind.EOF; k = s.scan()) {
    if (k !== SyntaxKind.LineCommentTrivia && k !== SyntaxKind.BlockCommentTrivia) continue;
    const offset = s.getTokenOffset();
    if (offset < span.start || offset >= span.end) out.push(text.slice(offset, offset + s.getTokenLength()));
  }
  return out;
}

function verify(before: string, after: string, path: readonly string[], value: unknown): void {
  const old = parseJsonc(before);
  const now = parseJsonc(after);
  if (now.error) throw unsafe(`the edited file would not parse (${now.error})`);
  let got: unknown = now.data;
  for (const key of path) got = isObject(got) ? got[key] : undefined;
  if (!isDeepStrictEqual(got, value)) throw unsafe(`'${path.join(".")}' did not come out as written`);
  if (!isDeepStrictEqual(withMember(now.data, path, undefined), withMember(old.data, path, undefined)))
    throw unsafe("other settings would have changed");
  if (!isDeepStrictEqual(commentsOutside(after, path), commentsOutside(before, path)))
    throw unsafe("a comment would have been lost or moved");
}

function unsafe(why: string): PyroError {
  return new PyroError("conflict", `cannot safely edit the JSON config: ${why}`);
}
