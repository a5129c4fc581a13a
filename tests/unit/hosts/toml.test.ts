import { parse } from "smol-toml";
import { describe, expect, it } from "vitest";
import { removeCodexEntry, setCodexEntry } from "../../../src/hosts/codex.js";
import { removeTomlTable, replaceTomlTable, tomlKeyParts, tomlTable } from "../../../src/hosts/files.js";

const PATH = ["mcp_servers", "pyro"];
const section = tomlTable(PATH, { command: "/usr/bin/node", args: ["/p/bin/pyro.js", "mcp", "serve"] });

describe("editing pyro's table in a TOML config", () => {
  it("writes a new file holding only pyro's table", () => {
    const out = replaceTomlTable("", PATH, section);
    expect(parse(out)).toEqual({
      mcp_servers: { pyro: { command: "/usr/bin/node", args: ["/p/bin/pyro.js", "mcp", "serve"] } },
    });
  });

  it("appends after existing content and keeps it byte for byte", () => {
    const text = `# mine\nmodel = "o3" # keep\n\n[mcp_servers.other]\ncommand = "x"\n`;
    const out = replaceTomlTable(text, PATH, section);
    expect(out.startsWith(text)).toBe(true);
    expect((parse(out) as any).mcp_servers.other).toEqual({ command: "x" });
  });

  it("replaces the table and its sub-tables, keeping the comment that introduces the next table", () => {
    const text = [
      `model = "o3"`,
      ``,
      `[mcp_servers.pyro]`,
      `command = "/old/node"`,
      `args = ["/old/pyro.js", "mcp", "serve"]`,
      ``,
      `[mcp_servers.pyro.env]`,
      `A = "1"`,
      ``,
      `# profile for reviews`,
      `[profiles.review]`,
      `model = "gpt-5"`,
      ``,
      `[mcp_servers."pyro".tools]`,
      `x = 1`,
      ``,
    ].join("\n");
    const out = replaceTomlTable(text, PATH, section);
    expect(out).toContain("# profile for reviews\n[profiles.review]");
    expect(out).not.toContain("/old/");
    expect(out).not.toContain("[mcp_servers.pyro.env]");
    const doc = parse(out) as any;
    expect(doc.mcp_servers.pyro).toEqual({
      command: "/usr/bin/node",
      args: ["/p/bin/pyro.js", "mcp", "serve"],
    });
    expect(doc.profiles).toEqual({ review: { model: "gpt-5" } });
    expect(doc.model).toBe("o3");
  });

  it("does not mistake a server whose name starts with pyro for pyro", () => {
    const text = `[mcp_servers.pyro-old]\ncommand = "keep"\n`;
    const out = replaceTomlTable(text, PATH, section);
    expect((parse(out) as any).mcp_servers["pyro-old"]).toEqual({ command: "keep" });
  });

  it("splits dotted keys with quoted parts", () => {
    expect(tomlKeyParts(`mcp_servers . "py.ro" . 'x'`)).toEqual(["mcp_servers", "py.ro", "x"]);
  });

  it("refuses, rather than guesses, when pyro is written as an inline table", () => {
    const text = `[mcp_servers]\npyro = { command = "old" }\n`;
    expect(() => setCodexEntry(text, { command: "new", args: [] })).toThrow(/cannot safely edit/);
  });

  it("removes the table and its sub-tables, keeping the comments around them", () => {
    const text = `# mine\nmodel = "o3"\n\n# before\n[mcp_servers.pyro]\ncommand = "x"\n\n[mcp_servers.pyro.env]\nA = "1"\n\n# after\n[profiles.x]\nmodel = "m"\n`;
    expect(removeTomlTable(text, PATH)).toBe(
      `# mine\nmodel = "o3"\n\n# before\n\n# after\n[profiles.x]\nmodel = "m"\n`,
    );
  });

  it("appending pyro's table and removing it again gives the file back byte for byte", () => {
    for (const text of [`model = "o3"\n`, `[a]\nb = 1 # c\n`, ""])
      expect(removeTomlTable(replaceTomlTable(text, PATH, section), PATH)).toBe(text);
  });

  it("removing a table that is not there changes nothing", () => {
    const text = `[mcp_servers.pyro-old]\ncommand = "keep"\n`;
    expect(removeTomlTable(text, PATH)).toBe(text);
  });

  it("refuses to remove pyro written as an inline table", () => {
    expect(() => removeCodexEntry(`[mcp_servers]\npyro = { command = "old" }\n`)).toThrow(
      /cannot safely edit/,
    );
  });
});
