import { execFileSync } from "node:child_process";
import {
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { afterAll, describe, expect, it } from "vitest";
import type { PackedPath, SandboxSpec, SandboxState, WorkspaceBackend } from "../../src/backends/backend.js";
import { exportDirect } from "../../src/core/export-direct.js";
import { bwrapSkipReason, hostProcesses, suiteTitle } from "../helpers/sandbox.js";

/**
 * The host half of the fast export (core/export-direct.ts) fed hostile archives, as if
 * the reader had been subverted: GNU tar extracts them in a sandbox whose only writable
 * path is the private staging directory, and the walk after it refuses what the export
 * rules refuse. Whatever the archive holds, nothing outside the staging directory is
 * written, nothing is left behind, and the export falls back (null) or lands clean.
 */
const skip = bwrapSkipReason();

/** An archive made by Python's tarfile from entries it writes exactly as named. */
function hostileTar(entries: object[]): Buffer {
  const script = `
import io, json, sys, tarfile
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
    for e in json.loads(sys.argv[1]):
        i = tarfile.TarInfo(e["name"])
        i.type = {"pax": tarfile.XHDTYPE, "file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE,
                  "hard": tarfile.LNKTYPE, "chr": tarfile.CHRTYPE, "fifo": tarfile.FIFOTYPE}[e["type"]]
        i.mode = e.get("mode", 0o644)
        i.linkname = e.get("link", "")
        data = e.get("data", "").encode()
        i.size = len(data) if e["type"] == "file" else 0
        if "size" in e: i.size = e["size"]
        t.addfile(i, io.BytesIO(data) if i.size == len(data) else io.BytesIO(b"\\0" * i.size))
sys.stdout.buffer.write(buf.getvalue())
`;
  return execFileSync("python3", ["-c", script, JSON.stringify(entries)], { maxBuffer: 64 << 20 });
}

/** A backend whose reader hands over `archive` and says it ended cleanly. */
function backendWith(archive: Buffer): WorkspaceBackend {
  const pack: PackedPath = {
    stream: Readable.from([archive]),
    finished: Promise.resolve({ artifact_type: "directory" }),
    stop: () => {},
  };
  return { packWorkspacePath: async () => pack } as unknown as WorkspaceBackend;
}

const sandbox = { spec: {} as SandboxSpec, state: {} as SandboxState };

describe.skipIf(skip !== "")(
  suiteTitle("fast export: hostile archives on the host's extraction", skip),
  () => {
    const root = mkdtempSync(join(tmpdir(), "pyro-export-extract-"));
    const outside = join(root, "outside");
    mkdirSync(outside);
    writeFileSync(join(outside, "canary"), "untouched");
    afterAll(() => rmSync(root, { recursive: true, force: true }));

    /** Every path under `root` but the outputs: what an export must not have added. */
    const others = () =>
      readdirSync(root)
        .filter((n) => !n.startsWith("out-"))
        .sort();

    const cases: [string, object[]][] = [
      ["an absolute name", [{ name: `${outside}/pwned`, type: "file", data: "x" }]],
      ["a `..` name", [{ name: "../outside/pwned", type: "file", data: "x" }]],
      [
        "a write through a symlink it made",
        [
          { name: "link", type: "sym", link: outside },
          { name: "link/pwned", type: "file", data: "x" },
        ],
      ],
      [
        "a write through a relative symlink leading up",
        [
          { name: "up", type: "sym", link: "../../../../../../.." },
          { name: `up${outside}/pwned`, type: "file", data: "x" },
        ],
      ],
      ["a hard link to a host file", [{ name: "shadow", type: "hard", link: "/etc/shadow" }]],
      [
        "a hard link inside",
        [
          { name: "a", type: "file", data: "x" },
          { name: "b", type: "hard", link: "a" },
        ],
      ],
      ["a device", [{ name: "mem", type: "chr" }]],
      [
        "a name longer than the host can walk",
        [{ name: `${`${"d".repeat(200)}/`.repeat(20)}${"f".repeat(80)}`, type: "file", data: "x" }],
      ],
      ["a name deeper than 256 levels", [{ name: `${"d/".repeat(300)}f`, type: "file", data: "x" }]],
      ["a symlink out of the tree", [{ name: "etc", type: "sym", link: "/etc" }]],
    ];

    for (const [what, entries] of cases) {
      it(`${what}: falls back, writes nothing outside and leaves nothing`, async () => {
        const out = join(root, `out-${what.replace(/\W+/g, "-")}`);
        const got = await exportDirect(backendWith(hostileTar(entries)), sandbox, "tree", out);
        expect(got).toBeNull();
        expect(existsSync(out)).toBe(false);
        expect(others()).toEqual(["outside"]);
        expect(readdirSync(outside)).toEqual(["canary"]);
      });
    }

    it("a refusal at the first bytes, again and again, ends every extraction and leaves no process", async () => {
      // The extraction's bwrap is still setting up its sandbox then; killed there, it left
      // the sandbox's first process waiting forever, and the export with it (1 in ~10).
      const archive = hostileTar([{ name: "big", type: "file", size: 2 << 20 }]);
      for (let i = 0; i < 20; i++) {
        const out = join(root, `out-fast-${i}`);
        expect(
          await exportDirect(backendWith(archive), sandbox, "tree", out, { max_bytes: 1024 }),
        ).toBeNull();
      }
      expect(others()).toEqual(["outside"]);
      expect(hostProcesses((argv) => argv.some((a) => a.startsWith(root)))).toEqual([]);
    });

    it("a name twice: GNU tar's -k keeps the first, or refuses; nothing else lands", async () => {
      const out = join(root, "out-twice");
      // A directory over a file: kept as the file, silently (as -k does), and the walk is clean.
      const dirOverFile = hostileTar([
        { name: "twice", type: "file", data: "a" },
        { name: "twice", type: "dir" },
      ]);
      expect(await exportDirect(backendWith(dirOverFile), sandbox, "tree", out)).toMatchObject({
        entries: 2,
      });
      expect(readdirSync(out)).toEqual(["twice"]);
      expect(readFileSync(join(out, "twice"), "utf8")).toBe("a");
      rmSync(out, { recursive: true });
      // A file over a file, or an entry under a file: GNU tar says so, and the export falls back.
      for (const entries of [
        [
          { name: "twice", type: "file", data: "a" },
          { name: "twice", type: "file", data: "bb" },
        ],
        [
          { name: "twice", type: "file", data: "a" },
          { name: "twice/under", type: "file", data: "b" },
        ],
      ]) {
        expect(await exportDirect(backendWith(hostileTar(entries)), sandbox, "tree", out)).toBeNull();
        expect(existsSync(out)).toBe(false);
      }
      expect(others()).toEqual(["outside"]);
    });

    it("a file over the budget is refused as it streams: the extraction never gets all of it", async () => {
      const out = join(root, "out-budget");
      const archive = hostileTar([{ name: "big", type: "file", size: 8 << 20 }]);
      const got = await exportDirect(backendWith(archive), sandbox, "tree", out, { max_bytes: 1 << 20 });
      expect(got).toBeNull();
      expect(existsSync(out)).toBe(false);
      expect(others()).toEqual(["outside"]);
    });

    it("a setuid file, a mode-000 directory and a FIFO land as the export rules make them", async () => {
      const out = join(root, "out-modes");
      const archive = hostileTar([
        { name: "s", type: "file", data: "x", mode: 0o6755 },
        { name: "d", type: "dir", mode: 0 },
        { name: "d/f", type: "file", data: "y", mode: 0 },
      ]);
      const got = await exportDirect(backendWith(archive), sandbox, "tree", out);
      // The FIFO is skipped, as the agent skips it.
      expect(got).toEqual({ artifact_type: "directory", bytes: 2, entries: 3 });
      expect(readdirSync(out).sort()).toEqual(["d", "s"]);
      const umasked = (m: number) => m & ~process.umask();
      expect(lstatSync(join(out, "s")).mode & 0o7777).toBe(umasked(0o755));
      expect(lstatSync(join(out, "d")).mode & 0o7777).toBe(0o700);
      expect(lstatSync(join(out, "d", "f")).mode & 0o7777).toBe(0o600);
      expect(others()).toEqual(["outside"]);
    });
  },
);
