import { describe, expect, it } from "vitest";
import { parseJsonc, setJsonMember } from "../../../src/hosts/jsonc.js";

const PATH = ["mcp", "pyro"];
const ENTRY = { type: "local", command: ["/usr/bin/node", "/p/bin/pyro.js", "mcp", "serve"], enabled: true };

/** The JSONC text of ENTRY as a member at `indent` (two-space unit), as pyro writes it. */
function entryText(indent: string): string {
  return JSON.stringify(ENTRY, null, 2).split("\n").join(`\n${indent}`);
}

describe("editing one member of a JSONC config", () => {
  it("adds pyro after a commented last member, keeping the comment on that member's line", () => {
    const text = `{\n  // my servers\n  "mcp": {\n    "other": { "type": "local", "command": ["x"] } // keep me\n  }\n}\n`;
    const out = setJsonMember(text, PATH, ENTRY);
    expect(out).toBe(
      `{\n  // my servers\n  "mcp": {\n    "other": { "type": "local", "command": ["x"] }, // keep me\n    "pyro": ${entryText("    ")}\n  }\n}\n`,
    );
    expect(parseJsonc(out).data).toEqual({ mcp: { other: { type: "local", command: ["x"] }, pyro: ENTRY } });
  });

  it("keeps a file's trailing commas, and writes its own the same way", () => {
    const text = `{\n  "mcp": {\n    "other": {"command": ["x"]}, /* why */\n  },\n}\n`;
    const out = setJsonMember(text, PATH, ENTRY);
    expect(out).toBe(
      `{\n  "mcp": {\n    "other": {"command": ["x"]}, /* why */\n    "pyro": ${entryText("    ")},\n  },\n}\n`,
    );
  });

  it("creates the parent object when it is missing, indented like the file (tabs, CRLF)", () => {
    const text = `{\r\n\t"theme": "dark" // mine\r\n}\r\n`;
    const out = setJsonMember(text, PATH, ENTRY);
    expect(
      out.startsWith(
        `{\r\n\t"theme": "dark", // mine\r\n\t"mcp": {\r\n\t\t"pyro": {\r\n\t\t\t"type": "local",`,
      ),
    ).toBe(true);
    expect(out.replace(/\r\n/g, "")).not.toContain("\n");
    expect(parseJsonc(out).data).toEqual({ theme: "dark", mcp: { pyro: ENTRY } });
  });

  it("replaces only the value of an existing pyro member", () => {
    const text = `{\n  "mcp": {\n    // before pyro\n    "pyro": {"command": ["old"]}, // pyro's own\n    "z": 1 // after\n  }\n}\n`;
    const out = setJsonMember(text, PATH, ENTRY);
    expect(out).toBe(
      `{\n  "mcp": {\n    // before pyro\n    "pyro": ${entryText("    ")}, // pyro's own\n    "z": 1 // after\n  }\n}\n`,
    );
  });

  it("opens up an empty object, and grows a one-line file on its line", () => {
    expect(setJsonMember(`{\n  "mcp": {}\n}\n`, PATH, { a: 1 })).toBe(
      `{\n  "mcp": {\n    "pyro": {\n      "a": 1\n    }\n  }\n}\n`,
    );
    expect(setJsonMember(`{"mcp": {"o": 1}}`, PATH, { a: 1 })).toBe(`{"mcp": {"o": 1, "pyro": {"a":1}}}`);
  });

  it("writes a blank document as the given new document with the member", () => {
    expect(JSON.parse(setJsonMember("", PATH, ENTRY, { newDocument: { $schema: "s" } }))).toEqual({
      $schema: "s",
      mcp: { pyro: ENTRY },
    });
  });

  it.each([
    `{\n  // c\n  "mcp": {\n    "o": 1, // after o\n  },\n}\n`,
    `{\n  "mcp": {\n    "o": 1 // after o\n  }\n}\n`,
    `{\n\t"mcp": {\n\t\t"o": 1\n\t}\n}\n`,
    `{\r\n  "mcp": {\r\n    "o": 1\r\n  }\r\n}\r\n`,
    `{"mcp": {"o": 1}}`,
    `{\n  "mcp": {\n    /* only a comment */\n  }\n}\n`,
  ])("adding then removing pyro gives back the file byte for byte: %j", (text) => {
    const added = setJsonMember(text, PATH, ENTRY);
    expect(setJsonMember(added, PATH, undefined)).toBe(text);
  });

  it("removes pyro with its lines and its own trailing comment, and nothing else", () => {
    const text = `{\n  "mcp": {\n    "o": 1, // after o\n    "pyro": {"x": 1}, // pyro's\n    /* next */ "z": 2\n  }\n}\n`;
    expect(setJsonMember(text, PATH, undefined)).toBe(
      `{\n  "mcp": {\n    "o": 1, // after o\n    /* next */ "z": 2\n  }\n}\n`,
    );
  });

  it("removing a member that is not there changes nothing", () => {
    const text = `{\n  // c\n  "mcp": {"o": 1}\n}\n`;
    expect(setJsonMember(text, PATH, undefined)).toBe(text);
    expect(setJsonMember(`{"a": 1}`, PATH, undefined)).toBe(`{"a": 1}`);
  });

  it("refuses with conflict, rather than guessing, when the parent is not an object", () => {
    expect(() => setJsonMember(`{"mcp": ["x"]}`, PATH, ENTRY, { hint: "by hand" })).toThrow(
      expect.objectContaining({ code: "conflict", hint: "by hand" }),
    );
  });

  it("reads comments and trailing commas, and names the line of a real fault", () => {
    expect(parseJsonc(`{\n  // c\n  "a": [1,],\n}`)).toEqual({ data: { a: [1] } });
    expect(parseJsonc(`{\n  "a": 1\n  "b": 2\n}`).error).toBe("CommaExpected at line 3 column 3");
    expect(parseJsonc(`[1]`).error).toBe("the top level is not a JSON object");
  });
});
