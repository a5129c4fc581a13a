import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import ts from "typescript";
import { describe, expect, it } from "vitest";
import { PyroError } from "../../../src/errors.js";
import { REPO_ROOT } from "../../helpers/cli.js";

/**
 * Core errors are read on every surface (issue 12): a message or hint written in core
 * never spells a CLI flag in its text, where an MCP client or an SDK user would read a
 * flag they cannot pass. A hint names what to change as `{action}` with a structured
 * `{cli, tool}` action, rendered per surface (errors.ts).
 */
const CORE = join(REPO_ROOT, "src", "core");
const FLAG = /(^|[\s(`'"])--[a-z][a-z-]*/;

/** Texts only the CLI can produce, with why they may name its flags. */
const CLI_ONLY: Record<string, string> = {
  'secrets.ts: "--secret must look like NAME=VALUE, NAME=${HOST_VAR} or NAME=?"':
    "parseSecretOptions splits the CLI's --secret options; no other surface calls it",
};

/** `file: text` for every literal message or hint of a `new PyroError(...)` that spells a flag. */
function flagTexts(sf: ts.SourceFile): string[] {
  const out: string[] = [];
  const visit = (n: ts.Node): void => {
    if (ts.isNewExpression(n) && n.expression.getText(sf) === "PyroError")
      for (const arg of (n.arguments ?? []).slice(1, 3))
        if (
          (ts.isStringLiteral(arg) ||
            ts.isNoSubstitutionTemplateLiteral(arg) ||
            ts.isTemplateExpression(arg)) &&
          FLAG.test(arg.getText(sf))
        )
          out.push(`${sf.fileName.slice(CORE.length + 1)}: ${arg.getText(sf)}`);
    ts.forEachChild(n, visit);
  };
  visit(sf);
  return out;
}

function parse(path: string, text = readFileSync(path, "utf8")): ts.SourceFile {
  return ts.createSourceFile(path, text, ts.ScriptTarget.ES2022, true);
}

describe("core error texts", () => {
  it("spell no CLI flag: hints name it through a structured action", () => {
    const files = readdirSync(CORE).filter((f) => f.endsWith(".ts"));
    expect(files.length).toBeGreaterThan(30);
    const found = files.flatMap((f) => flagTexts(parse(join(CORE, f))));
    expect(found.filter((t) => !CLI_ONLY[t])).toEqual([]);
    // The exemptions list only what is still there.
    expect(Object.keys(CLI_ONLY).filter((t) => !found.includes(t))).toEqual([]);
  });

  it("the check sees a flag in a message or a hint (it can fail)", () => {
    const sf = parse(
      join(CORE, "probe.ts"),
      'new PyroError("conflict", "a ref (--repo-ref) needs a URL");\n' +
        'new PyroError("conflict", "taken", `pass --force to move it`);\n' +
        'new PyroError("conflict", "taken", "move it with {action}", { action: { cli: "--force" } });\n',
    );
    expect(flagTexts(sf)).toEqual([
      'probe.ts: "a ref (--repo-ref) needs a URL"',
      "probe.ts: `pass --force to move it`",
    ]);
  });

  it("an action is rendered per surface", () => {
    const e = new PyroError("conflict", "taken", "move it with {action}", {
      action: { cli: "--force", tool: "force: true" },
    });
    expect(e.hint).toBe("move it with `--force`");
    expect(e.hintFor("tool")).toBe("move it with force: true");
  });
});
