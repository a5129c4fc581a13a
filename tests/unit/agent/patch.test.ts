import { mkdir, readdir, readFile, symlink, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { AgentError } from "../../../src/agent/errors.js";
import { type AgentFixture, startAgent } from "./helpers.js";

let fx: AgentFixture;
beforeEach(async () => {
  fx = await startAgent();
  await mkdir(path.join(fx.root, "src"));
  await writeFile(path.join(fx.root, "src/app.py"), "def main():\n    print('hello')\n\nmain()\n");
  await writeFile(path.join(fx.root, "src/util.py"), "A = 1\nB = 2\nC = 3\n");
  await writeFile(path.join(fx.root, "old.txt"), "bye\n");
});
afterEach(() => fx.cleanup());

const read = (p: string) => readFile(path.join(fx.root, p), "utf8");
const apply = (patch: string) => fx.client.request("patch_apply", { patch });

const GIT_PATCH = `diff --git a/src/app.py b/src/app.py
--- a/src/app.py
+++ b/src/app.py
@@ -1,4 +1,4 @@
 def main():
-    print('hello')
+    print('hello, world')
 
 main()
diff --git a/docs/new.md b/docs/new.md
new file mode 100644
--- /dev/null
+++ b/docs/new.md
@@ -0,0 +1,2 @@
+# New
+text
diff --git a/old.txt b/old.txt
deleted file mode 100644
--- a/old.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
`;

describe("patch_apply", () => {
  it("applies a git-style multi-file patch that modifies, adds and deletes", async () => {
    const r = await apply(GIT_PATCH);
    expect(r).toEqual({
      changed: true,
      files: [
        { path: "src/app.py", status: "modified" },
        { path: "docs/new.md", status: "added" },
        { path: "old.txt", status: "deleted" },
      ],
    });
    expect(await read("src/app.py")).toContain("hello, world");
    expect(await read("docs/new.md")).toBe("# New\ntext\n");
    await expect(read("old.txt")).rejects.toThrow();
  });

  it("applies a plain patch without a/ b/ prefixes", async () => {
    const r = await apply(
      "--- src/util.py\n+++ src/util.py\n@@ -1,3 +1,3 @@\n A = 1\n-B = 2\n+B = 20\n C = 3\n",
    );
    expect(r.files).toEqual([{ path: "src/util.py", status: "modified" }]);
    expect(await read("src/util.py")).toBe("A = 1\nB = 20\nC = 3\n");
  });

  it("changes nothing when a later file's hunk fails, and names that hunk", async () => {
    const patch = `--- a/src/util.py
+++ b/src/util.py
@@ -1,3 +1,3 @@
 A = 1
-B = 2
+B = 22
 C = 3
--- a/src/app.py
+++ b/src/app.py
@@ -1,2 +1,2 @@
 def main():
-    print('hello')
+    print('hi')
@@ -3,2 +3,2 @@
 
-main()  # this line is not in the file
+main(1)
--- /dev/null
+++ b/brand/new.txt
@@ -0,0 +1 @@
+new
`;
    const err = (await apply(patch).catch((e: AgentError) => e)) as AgentError;
    expect(err.code).toBe("patch_rejected");
    expect(err.message).toBe(
      'hunk 2 of src/app.py (@@ -3,2 +3,2 @@) does not apply: "main()  # this line is not in the file" was not found after a blank line',
    );
    expect(await read("src/util.py")).toBe("A = 1\nB = 2\nC = 3\n");
    expect(await read("src/app.py")).toContain("print('hello')");
    expect(await readdir(fx.root)).not.toContain("brand");
    // No staged temp files are left behind.
    expect((await readdir(path.join(fx.root, "src"))).sort()).toEqual(["app.py", "util.py"]);
  });

  it("refuses a patch touching a path outside the workspace and changes nothing", async () => {
    await symlink(fx.outside, path.join(fx.root, "out"));
    const patch = `--- a/src/util.py
+++ b/src/util.py
@@ -1 +1 @@
-A = 1
+A = 100
--- /dev/null
+++ b/out/evil.txt
@@ -0,0 +1 @@
+evil
`;
    const err = (await apply(patch).catch((e: AgentError) => e)) as AgentError;
    expect(err.code).toBe("path_outside_workspace");
    expect(await read("src/util.py")).toBe("A = 1\nB = 2\nC = 3\n");
    expect(await readdir(fx.outside)).toEqual([]);
    const dotdot = (await apply("--- /dev/null\n+++ b/../escape.txt\n@@ -0,0 +1 @@\n+x\n").catch(
      (e: AgentError) => e,
    )) as AgentError;
    expect(dotdot.code).toBe("path_outside_workspace");
  });

  it("rejects adding a file that exists and modifying one that does not", async () => {
    const add = (await apply("--- /dev/null\n+++ b/old.txt\n@@ -0,0 +1 @@\n+x\n").catch(
      (e: AgentError) => e,
    )) as AgentError;
    expect(add).toMatchObject({ code: "patch_rejected", message: "old.txt already exists" });
    const mod = (await apply("--- a/ghost.txt\n+++ b/ghost.txt\n@@ -1 +1 @@\n-a\n+b\n").catch(
      (e: AgentError) => e,
    )) as AgentError;
    expect(mod).toMatchObject({ code: "patch_rejected", message: "ghost.txt does not exist" });
  });

  it("calls an empty patch invalid_argument", async () => {
    for (const patch of ["", "  \n", "just some prose, no diff\n"]) {
      const err = (await apply(patch).catch((e: AgentError) => e)) as AgentError;
      expect(err.code).toBe("invalid_argument");
    }
  });
});
