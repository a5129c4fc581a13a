import { mkdir, readdir, readFile, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { createTwoFilesPatch } from "diff";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { AgentError } from "../../../src/agent/errors.js";
import { applyHunks } from "../../../src/agent/guest/patch/apply.js";
import { parsePatchText } from "../../../src/agent/guest/patch/parse.js";
import { type AgentFixture, startAgent } from "./helpers.js";

/**
 * Patches as models really write them: bare `@@` headers, wrong line numbers and
 * counts, CRLF files, files without a final newline, new/deleted/renamed files, several
 * files with one failing hunk, ambiguous context, and the `*** Begin Patch` envelope.
 */

const CALC = `def add(a, b):
    return a - b


def sub(a, b):
    return a - b


def main():
    print(add(2, 3))
`;

let fx: AgentFixture;
beforeEach(async () => {
  fx = await startAgent();
  await mkdir(path.join(fx.root, "src"));
  await writeFile(path.join(fx.root, "calc.py"), CALC);
  await writeFile(path.join(fx.root, "src/util.py"), "A = 1\nB = 2\nC = 3\n");
});
afterEach(() => fx.cleanup());

const read = (p: string) => readFile(path.join(fx.root, p), "utf8");
const write = (p: string, text: string) => writeFile(path.join(fx.root, p), text);
const apply = (patch: string) => fx.client.request("patch_apply", { patch });
const failure = (patch: string) =>
  apply(patch).then(
    (r) => {
      throw new Error(`expected a failure, got ${JSON.stringify(r)}`);
    },
    (e: AgentError) => e,
  );
const lines = (...l: string[]) => `${l.join("\n")}\n`;

describe("patch_apply: unified diffs as models write them", () => {
  it("locates a hunk with a bare @@ header by its context and changes the file", async () => {
    const r = await apply(
      lines(
        "--- a/calc.py",
        "+++ b/calc.py",
        "@@",
        " def add(a, b):",
        "-    return a - b",
        "+    return a + b",
      ),
    );
    expect(r).toEqual({ changed: true, files: [{ path: "calc.py", status: "modified" }] });
    expect(await read("calc.py")).toBe(CALC.replace("return a - b", "return a + b"));
  });

  it("applies a hunk whose line numbers and counts are wrong where its context is", async () => {
    const r = await apply(
      lines(
        "--- calc.py",
        "+++ calc.py",
        "@@ -40,3 +40,3 @@",
        " def main():",
        "-    print(add(2, 3))",
        "+    print(add(2, 3), sub(5, 1))",
      ),
    );
    expect(r.files).toEqual([{ path: "calc.py", status: "modified" }]);
    expect(await read("calc.py")).toBe(CALC.replace("print(add(2, 3))", "print(add(2, 3), sub(5, 1))"));
  });

  it("refuses a bare hunk whose context appears twice, naming the lines, and changes nothing", async () => {
    const err = await failure(
      lines("--- a/calc.py", "+++ b/calc.py", "@@", "-    return a - b", "+    return a + b"),
    );
    expect(err.code).toBe("patch_rejected");
    expect(err.message).toBe(
      "hunk 1 of calc.py (@@) does not apply: its context appears 2 times (at lines 2, 6); add context lines or line numbers so that it matches once",
    );
    expect(err.hint).toContain("nothing was changed");
    expect(await read("calc.py")).toBe(CALC);
  });

  it("takes the occurrence nearest the stated line when the context appears twice", async () => {
    const r = await apply(
      lines(
        "--- a/calc.py",
        "+++ b/calc.py",
        "@@ -7,2 +7,2 @@",
        "-    return a - b",
        "+    return a - b  # checked",
      ),
    );
    expect(r.changed).toBe(true);
    expect(await read("calc.py")).toBe(CALC.replace(/(sub\(a, b\):\n {4}return a - b)/, "$1  # checked"));
  });

  it("uses the line after a bare @@ to pick among repeated contexts", async () => {
    await apply(
      lines(
        "--- a/calc.py",
        "+++ b/calc.py",
        "@@ def sub(a, b):",
        "-    return a - b",
        "+    return a - b - 0",
      ),
    );
    expect(await read("calc.py")).toContain("def sub(a, b):\n    return a - b - 0\n");
    expect(await read("calc.py")).toContain("def add(a, b):\n    return a - b\n");
  });

  it("tolerates context whose trailing whitespace differs and keeps the file's own lines", async () => {
    await write("src/util.py", "A = 1   \nB = 2\nC = 3\n");
    await apply(lines("--- a/src/util.py", "+++ b/src/util.py", "@@", " A = 1", "-B = 2", "+B = 20"));
    expect(await read("src/util.py")).toBe("A = 1   \nB = 20\nC = 3\n");
  });

  it("applies an LF patch to a CRLF file and keeps CRLF", async () => {
    await write("win.txt", "one\r\ntwo\r\nthree\r\n");
    const r = await apply(
      lines("--- a/win.txt", "+++ b/win.txt", "@@", " one", "-two", "+TWO", "+two and a half"),
    );
    expect(r.changed).toBe(true);
    expect(await read("win.txt")).toBe("one\r\nTWO\r\ntwo and a half\r\nthree\r\n");
  });

  it("honours \\ No newline at end of file, both adding and keeping a missing final newline", async () => {
    await write("a.txt", "x\ny");
    await apply(
      lines("--- a/a.txt", "+++ b/a.txt", "@@", " x", "-y", "\\ No newline at end of file", "+y", "+z"),
    );
    expect(await read("a.txt")).toBe("x\ny\nz\n");
    await write("b.txt", "x\ny");
    await apply(lines("--- a/b.txt", "+++ b/b.txt", "@@", " x", "-y", "+Y"));
    expect(await read("b.txt")).toBe("x\nY");
    await apply(
      lines(
        "--- a/src/util.py",
        "+++ b/src/util.py",
        "@@",
        " B = 2",
        "-C = 3",
        "+C = 4",
        "\\ No newline at end of file",
      ),
    );
    expect(await read("src/util.py")).toBe("A = 1\nB = 2\nC = 4");
  });

  it("adds a file from --- /dev/null and deletes one to +++ /dev/null, with bare headers", async () => {
    const r = await apply(
      lines(
        "--- /dev/null",
        "+++ b/docs/notes.md",
        "@@",
        "+# Notes",
        "+",
        "+text",
        "--- a/src/util.py",
        "+++ /dev/null",
        "@@",
        "-A = 1",
        "-B = 2",
        "-C = 3",
      ),
    );
    expect(r).toEqual({
      changed: true,
      files: [
        { path: "docs/notes.md", status: "added" },
        { path: "src/util.py", status: "deleted" },
      ],
    });
    expect(await read("docs/notes.md")).toBe("# Notes\n\ntext\n");
    await expect(read("src/util.py")).rejects.toThrow();
  });

  it("renames with git's rename from/to headers, applying a bare hunk to the moved file", async () => {
    await writeFile(path.join(fx.root, "run.sh"), "#!/bin/sh\necho old\n", { mode: 0o755 });
    const r = await apply(
      lines(
        "diff --git a/run.sh b/bin/run.sh",
        "similarity index 80%",
        "rename from run.sh",
        "rename to bin/run.sh",
        "--- a/run.sh",
        "+++ b/bin/run.sh",
        "@@",
        " #!/bin/sh",
        "-echo old",
        "+echo new",
      ),
    );
    expect(r.files).toEqual([
      { path: "run.sh", status: "deleted" },
      { path: "bin/run.sh", status: "added" },
    ]);
    expect(await read("bin/run.sh")).toBe("#!/bin/sh\necho new\n");
    expect((await stat(path.join(fx.root, "bin/run.sh"))).mode & 0o777).toBe(0o755);
    expect(await readdir(fx.root)).not.toContain("run.sh");
  });

  it("changes nothing when one hunk of several files fails, naming the file, the hunk and the missing line", async () => {
    const err = await failure(
      lines(
        "--- a/src/util.py",
        "+++ b/src/util.py",
        "@@",
        "-B = 2",
        "+B = 22",
        "--- a/calc.py",
        "+++ b/calc.py",
        "@@",
        " def main():",
        "-    print(add(2, 3))",
        "+    print(add(2, 4))",
        "@@",
        " def main():",
        "-    print(add(2, 3))",
        "-    raise SystemExit(0)",
        "+    print(add(2, 5))",
        "--- /dev/null",
        "+++ b/new/file.txt",
        "@@",
        "+new",
      ),
    );
    expect(err.code).toBe("patch_rejected");
    expect(err.message).toBe(
      'hunk 2 of calc.py (@@) does not apply: "raise SystemExit(0)" was not found after "print(add(2, 3))"',
    );
    expect(await read("src/util.py")).toBe("A = 1\nB = 2\nC = 3\n");
    expect(await read("calc.py")).toBe(CALC);
    expect(await readdir(fx.root)).not.toContain("new");
    expect((await readdir(fx.root)).sort()).toEqual(["calc.py", "src"]);
  });

  it("says which line of a hunk's context is not in the file", async () => {
    const err = await failure(
      lines("--- a/calc.py", "+++ b/calc.py", "@@", " def mul(a, b):", "-    return a * b"),
    );
    expect(err).toMatchObject({
      code: "patch_rejected",
      message: 'hunk 1 of calc.py (@@) does not apply: "def mul(a, b):" was not found',
    });
  });

  it("reports changed: false and lists nothing when the result equals the original", async () => {
    const r = await apply(
      lines(
        "--- a/src/util.py",
        "+++ b/src/util.py",
        "@@ -1,3 +1,3 @@",
        " A = 1",
        "-B = 2",
        "+B = 2",
        " C = 3",
      ),
    );
    expect(r).toEqual({ changed: false, files: [] });
    expect(await read("src/util.py")).toBe("A = 1\nB = 2\nC = 3\n");
  });

  it("calls file headers without any hunk invalid_argument instead of reporting success", async () => {
    const err = await failure(lines("--- a/src/util.py", "+++ b/src/util.py", "B = 20"));
    expect(err.code).toBe("invalid_argument");
    expect(await read("src/util.py")).toBe("A = 1\nB = 2\nC = 3\n");
  });
});

describe("patch_apply: the *** Begin Patch envelope", () => {
  it("updates, adds, deletes and moves files", async () => {
    await write("old.txt", "bye\n");
    await write("notes.txt", "keep\nthis\n");
    const r = await apply(
      lines(
        "*** Begin Patch",
        "*** Update File: calc.py",
        "@@ def add(a, b):",
        "-    return a - b",
        "+    return a + b",
        "@@ def main():",
        "-    print(add(2, 3))",
        "+    print(add(2, 3), sub(3, 2))",
        "*** Add File: docs/new.md",
        "+# New",
        "+text",
        "*** Delete File: old.txt",
        "*** Update File: notes.txt",
        "*** Move to: archive/notes.txt",
        "@@",
        " keep",
        "-this",
        "+that",
        "*** End Patch",
      ),
    );
    expect(r).toEqual({
      changed: true,
      files: [
        { path: "calc.py", status: "modified" },
        { path: "docs/new.md", status: "added" },
        { path: "old.txt", status: "deleted" },
        { path: "notes.txt", status: "deleted" },
        { path: "archive/notes.txt", status: "added" },
      ],
    });
    expect(await read("calc.py")).toBe(
      CALC.replace("return a - b", "return a + b").replace("print(add(2, 3))", "print(add(2, 3), sub(3, 2))"),
    );
    expect(await read("docs/new.md")).toBe("# New\ntext\n");
    expect(await read("archive/notes.txt")).toBe("keep\nthat\n");
    expect((await readdir(fx.root)).sort()).toEqual(["archive", "calc.py", "docs", "src"]);
  });

  it("appends a hunk of added lines, honours *** End of File and stacked @@ lines", async () => {
    await write("rep.txt", "end\nx\nend\n");
    await apply(
      lines(
        "*** Begin Patch",
        "*** Update File: rep.txt",
        "@@",
        "-end",
        "+END",
        "*** End of File",
        "*** Update File: src/util.py",
        "@@",
        "+D = 4",
        "*** End Patch",
      ),
    );
    expect(await read("rep.txt")).toBe("end\nx\nEND\n");
    expect(await read("src/util.py")).toBe("A = 1\nB = 2\nC = 3\nD = 4\n");
  });

  it("rejects an envelope hunk that does not apply with patch_rejected, changing nothing", async () => {
    const err = await failure(
      lines(
        "*** Begin Patch",
        "*** Add File: fresh.txt",
        "+fresh",
        "*** Update File: src/util.py",
        "@@",
        "-B = 3",
        "+B = 30",
        "*** End Patch",
      ),
    );
    expect(err).toMatchObject({
      code: "patch_rejected",
      message: 'hunk 1 of src/util.py (@@) does not apply: "B = 3" was not found',
    });
    expect(await readdir(fx.root)).not.toContain("fresh.txt");
    expect(await read("src/util.py")).toBe("A = 1\nB = 2\nC = 3\n");
  });

  it("calls a malformed envelope invalid_argument, saying what is wrong with it", async () => {
    const cases: [string, string][] = [
      [
        lines("*** Begin Patch", "*** Update File: calc.py", "@@", "-def add(a, b):", "+def add(a, c):"),
        "line 6 of the patch: the patch ends without *** End Patch",
      ],
      [
        lines("*** Begin Patch", "*** Frobnicate File: calc.py", "*** End Patch"),
        'line 2 of the patch: expected *** Add File:, *** Delete File:, *** Update File: or *** End Patch, got "*** Frobnicate File: calc.py"',
      ],
      [
        lines("*** Begin Patch", "*** Update File: calc.py", "*** End Patch"),
        "line 3 of the patch: *** Update File: calc.py has no hunks",
      ],
    ];
    for (const [patch, message] of cases) {
      expect(await failure(patch)).toMatchObject({ code: "invalid_argument", message });
    }
    expect(await read("calc.py")).toBe(CALC);
  });
});

describe("patch_apply: diffs made by tools still apply exactly", () => {
  /** mulberry32: deterministic, so a failure can be replayed from its seed. */
  const prng = (seed: number) => () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };

  it("replays jsdiff patches of random edits (0 to 3 context lines, CRLF, no final newline)", () => {
    const random = prng(11);
    const pick = <T>(xs: T[]) => xs[Math.floor(random() * xs.length)]!;
    const words = ["a", "b", "c", "}", "", "return x", "  x += 1"];
    for (let round = 0; round < 400; round++) {
      const eol = round % 5 === 0 ? "\r\n" : "\n";
      const before = Array.from({ length: Math.floor(random() * 25) }, () => pick(words));
      const after = [...before];
      for (let edits = Math.floor(random() * 4) + 1; edits > 0; edits--) {
        const at = Math.floor(random() * (after.length + 1));
        if (random() < 0.5 && after.length > 0) after.splice(Math.min(at, after.length - 1), 1);
        else after.splice(at, 0, pick(words));
      }
      const text = (ls: string[], end: boolean) => (ls.length ? ls.join(eol) + (end ? eol : "") : "");
      const a = text(before, random() < 0.8);
      const b = text(after, random() < 0.8);
      const context = Math.floor(random() * 4);
      const patch = createTwoFilesPatch("a/f", "b/f", a, b, "", "", { context });
      const parsed = parsePatchText(patch);
      const result = parsed.length ? applyHunks(a, parsed[0]!.hunks) : a;
      expect(result, `round ${round}: ${JSON.stringify({ a, b, context })}`).toBe(b);
    }
  });
});
