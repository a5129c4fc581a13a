import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type McpFixture, mcpFixture, PROJECT } from "./helpers.js";

/**
 * workspace_patch_apply with patches as models write them, end to end through the MCP
 * server (fake backend, real guest agent): a bare `@@` hunk used to come back as
 * "modified calc.sh" with the file untouched.
 */

let fx: McpFixture;
beforeAll(async () => {
  fx = await mcpFixture();
});
afterAll(() => fx.cleanup());

const seeded = () => fx.pyro.createWorkspace({ seedPath: fx.project });
const calc = async (id: string) => (await fx.pyro.readWorkspaceFile(id, "calc.sh")).content;

describe("workspace_patch_apply", () => {
  it("applies a bare-@@ patch: the file changes and the failing check passes", async () => {
    const w = await seeded();
    const patch = [
      "--- a/calc.sh",
      "+++ b/calc.sh",
      "@@",
      "-add() { echo $(($1 - $2)); }",
      "+add() { echo $(($1 + $2)); }",
      "",
    ].join("\n");
    const r = await fx.call("workspace_patch_apply", { workspace_id: w.workspace_id, patch });
    expect(r.isError).toBeFalsy();
    expect(r.structuredContent).toEqual({
      workspace_id: w.workspace_id,
      changed: true,
      files: [{ path: "calc.sh", status: "modified" }],
    });
    expect(r.content[0]).toMatchObject({ text: expect.stringContaining("patched modified calc.sh") });
    expect(await calc(w.workspace_id)).toBe("add() { echo $(($1 + $2)); }\n");
    expect((await fx.pyro.execWorkspace(w.workspace_id, "sh check.sh")).exit_code).toBe(0);
  });

  it("applies the *** Begin Patch envelope", async () => {
    const w = await seeded();
    const patch = [
      "*** Begin Patch",
      "*** Update File: calc.sh",
      "@@",
      "-add() { echo $(($1 - $2)); }",
      "+add() { echo $(($1 + $2)); }",
      "*** Add File: docs/fix.txt",
      "+fixed",
      "*** End Patch",
      "",
    ].join("\n");
    const r = await fx.ok("workspace_patch_apply", { workspace_id: w.workspace_id, patch });
    expect(r.files).toEqual([
      { path: "calc.sh", status: "modified" },
      { path: "docs/fix.txt", status: "added" },
    ]);
    expect((await fx.pyro.execWorkspace(w.workspace_id, "sh check.sh")).exit_code).toBe(0);
  });

  it("returns patch_rejected naming the file and hunk for a bare hunk whose context is not there, and changes nothing", async () => {
    const w = await seeded();
    const patch = [
      "--- a/docs/readme.txt",
      "+++ b/docs/readme.txt",
      "@@",
      "-hello",
      "+hi",
      "--- a/calc.sh",
      "+++ b/calc.sh",
      "@@",
      "-add() { echo $(($1 * $2)); }",
      "+add() { echo $(($1 + $2)); }",
      "",
    ].join("\n");
    const error = await fx.fails("workspace_patch_apply", { workspace_id: w.workspace_id, patch });
    expect(error).toMatchObject({
      code: "patch_rejected",
      message: 'hunk 1 of calc.sh (@@) does not apply: "add() { echo $(($1 * $2)); }" was not found',
    });
    expect(await calc(w.workspace_id)).toBe(PROJECT["calc.sh"]);
    expect((await fx.pyro.readWorkspaceFile(w.workspace_id, "docs/readme.txt")).content).toBe("hello\n");
    expect((await fx.pyro.diffWorkspace(w.workspace_id)).changed).toBe(false);
  });

  it("reports changed: false when the patch leaves the bytes as they were", async () => {
    const w = await seeded();
    const patch = [
      "--- a/calc.sh",
      "+++ b/calc.sh",
      "@@ -1 +1 @@",
      "-add() { echo $(($1 - $2)); }",
      "+add() { echo $(($1 - $2)); }",
      "",
    ].join("\n");
    const r = await fx.call("workspace_patch_apply", { workspace_id: w.workspace_id, patch });
    expect(r.structuredContent).toMatchObject({ changed: false, files: [] });
    expect(r.content[0]).toMatchObject({ text: expect.stringContaining("the patch changed nothing") });
  });
});
