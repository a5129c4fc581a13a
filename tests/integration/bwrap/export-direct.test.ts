import { lstatSync, readdirSync, readFileSync, readlinkSync } from "node:fs";
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startReader } from "../../../src/backends/bwrap/pack.js";
import { TarCounter } from "../../../src/util/tar-count.js";
import { bwrapSkipReason, type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";
import { lastVia, refusalOf } from "../../helpers/transfer.js";

/**
 * The fast export of a running bwrap workspace (core/export-direct.ts, bwrap/pack.ts):
 * GNU tar reads the path from the sandbox's overlay in a sandbox of its own, GNU tar
 * extracts it in another. It must make exactly what the agent's export makes, take only
 * the plain case, and leave every other one (and every refusal) to the agent, with
 * nothing left behind on the host.
 */
const skip = bwrapSkipReason();

/** Every entry under `root`: type, mode bits, size or target, and a file's mtime and data. */
function describeTree(root: string): Record<string, string> {
  const out: Record<string, string> = {};
  const visit = (rel: string) => {
    const st = lstatSync(join(root, rel));
    const mode = (st.mode & 0o7777).toString(8);
    if (st.isSymbolicLink()) out[rel] = `link ${readlinkSync(join(root, rel))}`;
    else if (st.isFile())
      out[rel] =
        `file ${mode} ${st.size} ${Math.floor(st.mtimeMs / 1000)} ${readFileSync(join(root, rel)).toString("base64").slice(0, 40)}`;
    else if (st.isDirectory()) {
      out[rel] = `dir ${mode} ${Math.floor(st.mtimeMs / 1000)}`;
      for (const name of readdirSync(join(root, rel)).sort()) visit(rel === "." ? name : `${rel}/${name}`);
    } else out[rel] = "other";
  };
  visit(".");
  return out;
}

describe.skipIf(skip !== "")(suiteTitle("bwrap fast export (no agent relay)", skip), () => {
  let h: Harness;
  let id: string;
  let out: string;
  const sh = async (command: string) => {
    const r = await h.pyro.execWorkspace(id, command);
    expect(r.exit_code, `\`${command}\` failed: ${r.stderr}`).toBe(0);
    return r.stdout.trim();
  };
  /** How the last export of `ws` went: `tar` (this path) or `agent`. */
  const exportVia = (ws = id) => lastVia(h, ws, "export");
  /** Whatever an export left beside its output (its private staging directories). */
  const leftovers = () => readdirSync(out).filter((n) => n.startsWith(".pyro-export-"));
  const refusal = refusalOf;

  beforeAll(async () => {
    h = await openHarness("export-direct");
    out = await h.tempDir("export-direct-out");
    id = (await h.create({})).workspace_id;
    const long = "n".repeat(120);
    await sh(
      [
        "mkdir -p tree/sub/deep tree/empty tree/locked tree/ro",
        `mkdir -p tree/${long}/${long}`,
        "printf 'hello\\n' > tree/a.txt && : > tree/sub/empty.txt",
        "head -c 300000 /dev/urandom > tree/sub/deep/blob.bin",
        `echo long > tree/${long}/${long}/${long}.txt`,
        "echo x > tree/exec.sh && chmod 755 tree/exec.sh",
        "echo x > tree/open && chmod 777 tree/open",
        "echo x > tree/private && chmod 600 tree/private",
        "echo x > tree/setuid && chmod 4755 tree/setuid",
        "echo x > tree/ro/file && chmod 555 tree/ro",
        "chmod 700 tree/locked",
        "ln -s sub/deep/blob.bin tree/rel-link && ln -s ../a.txt tree/sub/up-link",
        "mkfifo tree/fifo",
        "echo dash > tree/-L && echo q > tree/-quit && echo dd > tree/--",
        "touch -d '2001-02-03 04:05:06' tree/a.txt tree/sub/deep/blob.bin",
        "ln -s . via",
        // Last: the exported directory itself read-only and old.
        "touch -d '2001-01-01 00:00:00' tree/sub tree && chmod 500 tree",
      ].join(" && "),
    );
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("exports a plain directory through the reader, exactly as the agent's export makes it", async () => {
    const fast = await h.pyro.exportWorkspace(id, "/workspace/tree", join(out, "fast"));
    expect(exportVia()).toBe("tar");
    // The same tree by a path with a symlink on the way: the agent's export.
    const slow = await h.pyro.exportWorkspace(id, "via/tree", join(out, "slow"));
    expect(exportVia()).toBe("agent");
    const tree = describeTree(join(out, "fast"));
    expect(tree).toEqual(describeTree(join(out, "slow")));
    expect({ ...fast, output_path: "", path: "" }).toEqual({ ...slow, output_path: "", path: "" });
    // What both make: the FIFO skipped, setuid dropped, permission bits under the umask
    // and the owner's read and write (search) added, mtimes kept, links inside.
    const umasked = (m: number) => (m & ~process.umask()).toString(8);
    expect(tree.fifo).toBeUndefined();
    expect(tree.setuid).toMatch(new RegExp(`^file ${umasked(0o755)} `));
    expect(tree.private).toMatch(/^file 600 /);
    expect(tree.open).toMatch(new RegExp(`^file ${umasked(0o777)} `));
    expect(tree.ro).toMatch(new RegExp(`^dir ${umasked(0o755)} `));
    expect(tree["."]).toBe(`dir 700 ${Date.UTC(2001, 0, 1) / 1000}`);
    expect(tree.sub).toBe(`dir ${umasked(0o755)} ${Date.UTC(2001, 0, 1) / 1000}`);
    expect(tree["-L"]).toMatch(/ ZGFzaAo=$/);
    expect(tree["a.txt"]).toBe(`file 644 6 ${Date.UTC(2001, 1, 3, 4, 5, 6) / 1000} aGVsbG8K`);
    expect(tree["sub/up-link"]).toBe("link ../a.txt");
    expect(fast.bytes).toBe(6 + 300_000 + 5 + 2 * 5 + 5 + 2 + 3);
    expect(leftovers()).toEqual([]);
  });

  it("exports a file, a file named like an option, and the whole workspace, through the reader", async () => {
    const file = await h.pyro.exportWorkspace(id, "tree/sub/deep/blob.bin", join(out, "blob.bin"));
    expect(exportVia()).toBe("tar");
    expect(file).toMatchObject({ artifact_type: "file", bytes: 300_000, entries: 1 });
    expect(
      readFileSync(join(out, "blob.bin")).equals(readFileSync(join(out, "fast", "sub/deep/blob.bin"))),
    ).toBe(true);
    for (const name of ["-L", "-quit", "--"]) {
      const one = await h.pyro.exportWorkspace(id, `tree/${name}`, join(out, `opt${name}`));
      expect([exportVia(), one.entries], name).toEqual(["tar", 1]);
      expect(readFileSync(join(out, `opt${name}`), "utf8")).toBe(
        readFileSync(join(out, "fast", name), "utf8"),
      );
    }
    const all = await h.pyro.exportWorkspace(id, "/workspace", join(out, "all"));
    expect(exportVia()).toBe("tar");
    expect(all.artifact_type).toBe("directory");
    expect(readlinkSync(join(out, "all", "via"))).toBe(".");
  });

  it("leaves a hard link, a symlink leading out and a path through one to the agent, which refuses them; nothing is left", async () => {
    await sh(
      "mkdir -p hl out abs && echo x > hl/a && ln hl/a hl/b && ln -s /etc/hostname abs/leak && ln -s /etc etc",
    );
    for (const [path, why] of [
      ["hl", /hard link/],
      ["abs", /leads outside/],
      ["etc/hostname", /outside the workspace/],
      ["abs/leak", /outside the workspace/],
    ] as const) {
      const got = await refusal(
        h.pyro.exportWorkspace(id, path, join(out, `refused-${path.replace("/", "-")}`)),
      );
      expect(got, path).toMatchObject({
        code: "path_outside_workspace",
        message: expect.stringMatching(why),
      });
      expect(
        readdirSync(out).filter((n) => n.startsWith("refused-")),
        path,
      ).toEqual([]);
      expect(leftovers(), path).toEqual([]);
    }
  });

  it("a tree deeper than a host path can name goes to the agent, and leaves nothing", async () => {
    // 250 levels of 16 characters: 4250 bytes, past PATH_MAX below the host's staging directory.
    // perl (Debian's perl-base): the shell keeps a path of its own and gives up at PATH_MAX.
    await sh(
      `mkdir deep && cd deep && perl -e 'for (1..250) { mkdir "a" x 16 or die; chdir "a" x 16 or die } open(F, ">f") or die'`,
    );
    const exports = () =>
      h.pyro.engine
        .store()
        .listEvents(id)
        .filter((e) => e.kind === "export").length;
    const before = exports();
    const got = await refusal(h.pyro.exportWorkspace(id, "deep", join(out, "deep")));
    // The agent refuses it (its names are bounded too); the reader never lands it.
    expect(got).toMatchObject({ code: "invalid_argument", message: expect.stringMatching(/^name too long/) });
    expect(exports()).toBe(before);
    expect(leftovers()).toEqual([]);
  });

  it("a reader sent down a symlink (as a swap between its check and its read would) finds no host file", async () => {
    const state = h.pyro.engine.store().getWorkspace(id)?.runtime.sandbox as {
      pid: number;
      start_time: string;
    };
    const dir = join(h.home, "workspaces", id, "sandbox");
    await sh("ln -s /usr/share usr-share && ln -s /etc/passwd host-passwd && ln -s /run/tar/lib run-tar-lib");
    for (const what of [
      { cwd: "usr-share", name: ".", type: "directory" as const },
      { cwd: "", name: "host-passwd/.", type: "file" as const },
      { cwd: "usr-share/doc", name: ".", type: "directory" as const },
    ]) {
      const pack = await startReader(dir, state, what);
      expect(pack, what.cwd).not.toBeNull();
      let bytes = 0;
      pack!.stream.on("data", (c: Buffer) => {
        bytes += c.length;
      });
      expect(await pack!.finished, JSON.stringify(what)).toBeNull();
      expect(bytes, JSON.stringify(what)).toBeLessThanOrEqual(10_240);
    }
    // Only tar's own files are there to find (its loader and libraries), read-only.
    const lib = await startReader(dir, state, { cwd: "run-tar-lib", name: ".", type: "directory" });
    const names: string[] = [];
    const c = new TarCounter();
    lib!.stream.on("data", (chunk: Buffer) => c.push(chunk));
    expect(await lib!.finished).not.toBeNull();
    expect(c.entries).toBeLessThan(10);
    expect(names).toEqual([]);
  });

  it("refuses an export over the workspace's disk budget (a sparse file) without filling the host", async () => {
    const small = (await h.create({ diskMib: 64 })).workspace_id;
    const r = await h.pyro.execWorkspace(
      small,
      "truncate -s 1G sparse && mkdir d && truncate -s 1G d/sparse",
    );
    expect(r.exit_code, r.stderr).toBe(0);
    for (const path of ["sparse", "d"]) {
      const got = await refusal(h.pyro.exportWorkspace(small, path, join(out, `big-${path}`)));
      expect(got, path).toMatchObject({
        code: "conflict",
        message: expect.stringMatching(/more than \d+ bytes/),
      });
      expect(readdirSync(out).filter((n) => n.startsWith("big-"))).toEqual([]);
      expect(leftovers()).toEqual([]);
    }
  });

  it("refuses an output directory that is not empty before reading anything", async () => {
    await mkdir(join(out, "full"));
    await writeFile(join(out, "full", "mine"), "keep");
    const got = await refusal(h.pyro.exportWorkspace(id, "tree", join(out, "full")));
    expect(got).toMatchObject({ code: "conflict" });
    expect(readdirSync(join(out, "full"))).toEqual(["mine"]);
    expect(leftovers()).toEqual([]);
  });
});
