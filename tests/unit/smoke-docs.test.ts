import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { REPO_ROOT } from "../helpers/cli.js";
import { USE_CASES } from "../smoke/scenarios.js";

/**
 * The recipes in docs/use-cases/ and the smoke scenarios stay one thing: every recipe's
 * numbered tool calls are exactly the calls its scenario makes (the smoke run checks the
 * scenario against its list; this checks the list against the recipe).
 */
const DIR = join(REPO_ROOT, "docs", "use-cases");

function toolCalls(markdown: string): string[] {
  const start = markdown.indexOf("\n## Tool calls\n");
  expect(start, "a '## Tool calls' section").toBeGreaterThan(-1);
  const rest = markdown.slice(start + 1);
  const end = rest.indexOf("\n## ", 3);
  const section = end === -1 ? rest : rest.slice(0, end);
  return [...section.matchAll(/^\d+\. `([a-z_]+)`/gm)].map((m) => m[1]!);
}

describe("use-case recipes", () => {
  it("there is one recipe per smoke scenario, and no other", async () => {
    const docs = (await readdir(DIR)).filter((f) => f.endsWith(".md")).map((f) => f.slice(0, -3));
    expect(docs.sort()).toEqual(USE_CASES.map((u) => u.name).sort());
    expect(docs.sort()).toEqual(["cold-start", "inspect", "parallel-workspaces", "repro-fix", "review-eval"]);
  });

  for (const uc of USE_CASES) {
    it(`${uc.name}: the recipe's tool calls are the scenario's, in order, with a prompt, CLI and SDK lines`, async () => {
      const md = await readFile(join(DIR, `${uc.name}.md`), "utf8");
      expect(toolCalls(md)).toEqual(uc.calls);
      for (const heading of ["## The prompt", "## CLI", "## SDK"]) expect(md).toContain(`\n${heading}\n`);
      // The recipe names the mode its scenario's server runs in.
      expect(md).toContain(`\`${uc.serverArgs[1]}\``);
    });
  }
});
