import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "vitest";
import type { PyroError } from "../../src/errors.js";
import type { ScenarioContext } from "./scenarios.js";
import { code, lsOf, sh } from "./util.js";

/**
 * Patches, the diff, exports and a reset to the baseline on every backend: patches are
 * all or nothing, in the unified form and the forms models write; a reset restores
 * content and mode exactly.
 */
const MAIN_PY = `${Array.from({ length: 12 }, (_, i) => `line ${i + 1}`).join("\n")}\n`;

async function errorOf(p: Promise<unknown>): Promise<PyroError> {
  return p.then(
    () => expect.unreachable("the call succeeded") as never,
    (e: PyroError) => e,
  );
}

async function patches(ctx: ScenarioContext, id: string) {
  const p = ctx.pyro;
  expect(await p.diffWorkspace(id)).toMatchObject({
    base_snapshot: "baseline",
    changed: false,
    patch: "",
    summary: { total: 0, added: 0, modified: 0, deleted: 0 },
    entries: [],
  });
  const multi = [
    ["--- a/app.py", "+++ b/app.py", "@@ -1 +1 @@", "-print('hello')", "+print('patched')"],
    ["--- /dev/null", "+++ b/docs/new.md", "@@ -0,0 +1 @@", "+new doc"],
    ["--- a/src/lib.txt", "+++ /dev/null", "@@ -1,2 +0,0 @@", "-one", "-two"],
  ];
  expect(await p.applyWorkspacePatch(id, `${multi.flat().join("\n")}\n`)).toMatchObject({
    changed: true,
    files: [
      { path: "app.py", status: "modified" },
      { path: "docs/new.md", status: "added" },
      { path: "src/lib.txt", status: "deleted" },
    ],
  });
  expect(await sh(p, id, "cat app.py docs/new.md; test ! -e src/lib.txt && echo deleted")).toBe(
    "print('patched')\nnew doc\ndeleted\n",
  );
  expect(await code(p.applyWorkspacePatch(id, "--- a/app.py\n+++ b/app.py\n@@ -1 +1 @@\n-nope\n+x\n"))).toBe(
    "patch_rejected",
  );
  // The second file's second hunk fails: the error names both, and the first file is untouched.
  await p.writeWorkspaceFile(id, "main.py", MAIN_PY);
  const before = (await p.diffWorkspace(id)).entries;
  const secondFails = [
    ["--- a/docs/new.md", "+++ b/docs/new.md", "@@ -1 +1 @@", "-new doc", "+changed doc"],
    ["--- a/main.py", "+++ b/main.py", "@@ -1,2 +1,2 @@", "-line 1", "+LINE 1", " line 2"],
    ["@@ -10,2 +10,2 @@", " line 10", "-line eleven", "+LINE 11"],
  ];
  const err = await errorOf(p.applyWorkspacePatch(id, `${secondFails.flat().join("\n")}\n`));
  expect([err.code, err.message]).toEqual(["patch_rejected", expect.stringContaining("main.py")]);
  expect(err.message).toContain("hunk 2");
  expect(await sh(p, id, "cat docs/new.md")).toBe("new doc\n");
  expect((await p.readWorkspaceFile(id, "main.py")).content).toBe(MAIN_PY);
  expect((await p.diffWorkspace(id)).entries).toEqual(before);
}

/** Patches as models write them: a bare @@, the *** Begin Patch envelope; an ambiguous one is refused. */
async function modelPatches(ctx: ScenarioContext, id: string) {
  const p = ctx.pyro;
  const bare = ["--- a/main.py", "+++ b/main.py", "@@", " line 6", "-line 7", "+LINE 7", ""];
  expect(await p.applyWorkspacePatch(id, bare.join("\n"))).toMatchObject({
    changed: true,
    files: [{ path: "main.py", status: "modified" }],
  });
  const envelope = [
    "*** Begin Patch",
    "*** Update File: docs/new.md",
    "@@",
    "-new doc",
    "+new doc, enveloped",
  ];
  await p.applyWorkspacePatch(id, [...envelope, "*** End Patch", ""].join("\n"));
  expect(await sh(p, id, "sed -n 7p main.py; cat docs/new.md")).toBe("LINE 7\nnew doc, enveloped\n");
  await p.writeWorkspaceFile(id, "twice.txt", "x\ny\nx\n");
  const err = await errorOf(p.applyWorkspacePatch(id, "--- a/twice.txt\n+++ b/twice.txt\n@@\n-x\n+z\n"));
  expect(err).toMatchObject({ code: "patch_rejected", message: expect.stringContaining("appears 2 times") });
  expect((await p.readWorkspaceFile(id, "twice.txt")).content).toBe("x\ny\nx\n");
  await sh(p, id, "rm twice.txt main.py");
}

/** The diff against the seed: entries, a summary and a unified patch with both sides' lines. */
async function diff(ctx: ScenarioContext, id: string) {
  const p = ctx.pyro;
  await sh(p, id, "rm bin/run.sh && echo fresh > added.txt");
  const d = await p.diffWorkspace(id);
  expect([d.changed, d.summary]).toEqual([true, { total: 5, added: 2, modified: 1, deleted: 2 }]);
  expect(d.entries).toEqual([
    { path: "added.txt", status: "added" },
    { path: "app.py", status: "modified" },
    { path: "bin/run.sh", status: "deleted" },
    { path: "docs/new.md", status: "added" },
    { path: "src/lib.txt", status: "deleted" },
  ]);
  expect(d.patch).toContain("--- a/app.py\n+++ b/app.py\n");
  expect(d.patch).toContain("-print('hello')\n+print('patched')\n");
  expect(d.patch).toContain("+fresh\n");
  expect(d.patch).toContain("-one\n-two\n");
}

async function exports(ctx: ScenarioContext, id: string) {
  const p = ctx.pyro;
  const out = await mkdtemp(join(tmpdir(), "pyro-parity-out-"));
  try {
    expect(await p.exportWorkspace(id, "app.py", join(out, "app.py"))).toMatchObject({
      artifact_type: "file",
      output_path: join(out, "app.py"),
    });
    expect(await readFile(join(out, "app.py"), "utf8")).toBe("print('patched')\n");
    expect(await p.exportWorkspace(id, "/workspace/docs", join(out, "docs"))).toMatchObject({
      artifact_type: "directory",
      output_path: join(out, "docs"),
    });
    expect(await readFile(join(out, "docs", "new.md"), "utf8")).toBe("new doc, enveloped\n");
    expect((await p.summarizeWorkspace(id)).outcome.export_count).toBeGreaterThanOrEqual(2);
  } finally {
    await rm(out, { recursive: true, force: true });
  }
}

/** Patches, the diff and exports, then a reset to the baseline (the session's first reset). */
export async function patchSession(ctx: ScenarioContext, id: string) {
  const p = ctx.pyro;
  await patches(ctx, id);
  await modelPatches(ctx, id);
  await diff(ctx, id);
  await exports(ctx, id);
  const r = await p.resetWorkspace(id);
  expect(r).toMatchObject({ reset_count: 1, workspace_reset: { snapshot_name: "baseline" } });
  expect((await p.diffWorkspace(id)).changed).toBe(false);
  expect((await p.readWorkspaceFile(id, "src/lib.txt")).content).toBe("one\ntwo\n");
  // Deleted files come back with their content and mode.
  expect(await sh(p, id, "stat -c %a bin/run.sh; ./bin/run.sh; ls -A | sort")).toBe(
    `755\nrun\n${lsOf(ctx, ["app.py", "bin", "link", "src"])}`,
  );
}
