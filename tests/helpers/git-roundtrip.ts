/**
 * The Git round trip against a real repository made here: seed a workspace from a dirty
 * checkout, change it in every way Git records (create, modify, delete, rename, chmod +x,
 * binary, nested directory, an ignored file), commit it to a new branch, and check the
 * branch on the host and that nothing else on the host moved. Shared by the unit tests
 * (fake backend) and the parity suite (every backend).
 */
import { execFileSync } from "node:child_process";
import { chmod, lstat, mkdir, readdir, readFile, readlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { expect } from "vitest";
import type { PyroError } from "../../src/errors.js";
import type { Pyro } from "../../src/sdk/pyro.js";
import { git, gitBytes, initGitRepo } from "./git.js";

export { git, gitBytes } from "./git.js";

export const BINARY = Buffer.from([
  0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0xff, 0xfe, 0x00, 0x01,
]);

/**
 * A checkout with history, a .gitignore, and a dirty working tree: a modified tracked
 * file, a staged change, an untracked file and an ignored one.
 */
export async function makeRepo(repo: string): Promise<{ seedCommit: string }> {
  await initGitRepo(repo);
  await writeFile(join(repo, "README.md"), "# demo\n");
  await mkdir(join(repo, "src"));
  await writeFile(join(repo, "src", "app.py"), "def add(a, b):\n    return a - b\n");
  await writeFile(join(repo, "old_name.txt"), "renamed content\n");
  await writeFile(join(repo, "remove_me.txt"), "bye\n");
  await writeFile(join(repo, "tool.sh"), "#!/bin/sh\necho tool\n");
  await writeFile(join(repo, "logo.bin"), BINARY);
  await writeFile(join(repo, ".gitignore"), "*.log\n__pycache__/\n");
  git(repo, "add", "-A");
  git(repo, "commit", "-qm", "first");
  await writeFile(join(repo, "README.md"), "# demo\nmore\n");
  git(repo, "commit", "-qam", "second");
  const seedCommit = git(repo, "rev-parse", "HEAD").trim();
  // Dirty: staged, modified, untracked, ignored.
  await writeFile(join(repo, "staged.txt"), "staged only\n");
  git(repo, "add", "staged.txt");
  await writeFile(join(repo, "README.md"), "# demo\nmore\nuncommitted on the host\n");
  await writeFile(join(repo, "notes.txt"), "untracked on the host\n");
  await writeFile(join(repo, "host.log"), "ignored on the host\n");
  return { seedCommit };
}

/** Everything on the host that a commit must not touch: files, modes, index, HEAD, refs, config. */
export async function hostState(repo: string, newBranch?: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  const walk = async (dir: string, rel: string) => {
    for (const name of (await readdir(dir)).sort()) {
      const abs = join(dir, name);
      const r = rel ? `${rel}/${name}` : name;
      if (r === ".git/objects" || r === ".git/logs") continue;
      if (
        newBranch &&
        (r === `.git/refs/heads/${newBranch}` || r.startsWith(`.git/refs/heads/${newBranch}/`))
      )
        continue;
      const st = await lstat(abs);
      if (st.isDirectory()) await walk(abs, r);
      else if (st.isSymbolicLink()) out[r] = `link:${await readlink(abs)}`;
      else out[r] = `${st.mode.toString(8)}:${(await readFile(abs)).toString("base64")}`;
    }
  };
  await walk(repo, "");
  out["#refs"] = git(repo, "for-each-ref", "--format=%(refname) %(objectname)")
    .split("\n")
    .filter(
      (l) =>
        !newBranch || !(l.startsWith(`refs/heads/${newBranch} `) || l.startsWith(`refs/heads/${newBranch}/`)),
    )
    .join("\n");
  return out;
}

async function code(p: Promise<unknown>): Promise<string> {
  return p.then(
    () => "ok",
    (e: PyroError) => e.code,
  );
}

/**
 * The round trip itself on `pyro` (any backend): returns after checking the branch, the
 * host's untouched state, the refusals and --force.
 */
export async function roundTrip(
  pyro: Pyro,
  repo: string,
  createOptions: Parameters<Pyro["createWorkspace"]>[0],
): Promise<void> {
  const { seedCommit } = await makeRepo(repo);
  const w = await pyro.createWorkspace({
    ...createOptions,
    seedPath: repo,
    name: `git-${Date.now() % 100000}`,
  });
  const id = w.workspace_id;
  try {
    expect(w.workspace_seed).toMatchObject({
      kind: "git",
      commit: seedCommit,
      repository: repo,
      skipped: { ignored: 1, submodules: 0, missing: 0 },
    });
    // Git works inside: the seed's working-tree changes show against HEAD.
    const status = await pyro.execWorkspace(id, "git status --porcelain && git log --format=%s");
    expect(status.exit_code, status.stderr).toBe(0);
    expect(status.stdout.split("\n").filter(Boolean).sort()).toEqual(
      [" M README.md", "?? notes.txt", "?? staged.txt", "first", "second"].sort(),
    );

    // Every kind of change, made by commands in the sandbox.
    await pyro.writeWorkspaceFile(id, "src/app.py", "def add(a, b):\n    return a + b\n");
    const r = await pyro.execWorkspace(
      id,
      [
        "mv old_name.txt new_name.txt",
        "rm remove_me.txt",
        "chmod +x tool.sh",
        "mkdir -p deep/er/still",
        "printf 'nested\\n' > deep/er/still/file.txt",
        "printf '\\000\\001\\002\\377binary' > new.bin",
        "printf '\\211PNG\\000changed' > logo.bin",
        "printf 'noise\\n' > build.log",
        "mkdir -p src/__pycache__ && printf '\\000pyc' > src/__pycache__/app.pyc",
        "ln -s src/app.py app_link",
      ].join(" && "),
    );
    expect(r.exit_code, r.stderr).toBe(0);

    // diff: .gitignore honoured, and its patch applies with git apply on a fresh checkout.
    const d = await pyro.diffWorkspace(id);
    const paths = d.entries.map((e) => e.path);
    expect(paths).not.toContain("build.log");
    expect(paths).not.toContain("src/__pycache__/app.pyc");
    const scratch = `${repo}-apply`;
    execFileSync("git", ["clone", "-q", repo, scratch]);
    git(scratch, "checkout", "-q", seedCommit);
    // The baseline is the seeded working tree: replay the host's dirty state first.
    await writeFile(join(scratch, "README.md"), "# demo\nmore\nuncommitted on the host\n");
    await writeFile(join(scratch, "notes.txt"), "untracked on the host\n");
    await writeFile(join(scratch, "staged.txt"), "staged only\n");
    execFileSync("git", ["-C", scratch, "apply", "--check", "-"], { input: d.patch });
    execFileSync("git", ["-C", scratch, "apply", "-"], { input: d.patch });
    expect(await readFile(join(scratch, "new.bin"))).toEqual(Buffer.from("\x00\x01\x02\xffbinary", "latin1"));
    expect((await lstat(join(scratch, "tool.sh"))).mode & 0o100).toBe(0o100);

    const before = await hostState(repo);
    const c = await pyro.commitWorkspace(id, { branch: "pyro/fix", message: "Fix add\n\nby the agent" });
    expect(c).toMatchObject({ branch: "pyro/fix", parent: seedCommit, repository: repo, replaced: null });
    expect(c.files).toEqual(
      [
        { path: "app_link", status: "added" },
        { path: "deep/er/still/file.txt", status: "added" },
        { path: "logo.bin", status: "modified" },
        { path: "new.bin", status: "added" },
        { path: "new_name.txt", status: "added" },
        { path: "old_name.txt", status: "deleted" },
        { path: "remove_me.txt", status: "deleted" },
        { path: "src/app.py", status: "modified" },
        { path: "tool.sh", status: "modified" },
      ].sort((a, b) => (a.path < b.path ? -1 : 1)),
    );
    // The branch: one commit on the seed commit with exactly the workspace's changes.
    expect(git(repo, "rev-parse", "pyro/fix").trim()).toBe(c.commit);
    expect(git(repo, "rev-parse", "pyro/fix^").trim()).toBe(seedCommit);
    expect(git(repo, "log", "-1", "--format=%B", "pyro/fix").trim()).toBe("Fix add\n\nby the agent");
    expect(
      git(repo, "diff", "--name-status", "-M", seedCommit, "pyro/fix").split("\n").filter(Boolean).sort(),
    ).toEqual(
      [
        "A\tapp_link",
        "A\tdeep/er/still/file.txt",
        "M\tlogo.bin",
        "A\tnew.bin",
        "R100\told_name.txt\tnew_name.txt",
        "D\tremove_me.txt",
        "M\tsrc/app.py",
        "M\ttool.sh",
      ].sort(),
    );
    expect(gitBytes(repo, "show", "pyro/fix:new.bin")).toEqual(
      Buffer.from("\x00\x01\x02\xffbinary", "latin1"),
    );
    expect(gitBytes(repo, "show", "pyro/fix:logo.bin")).toEqual(Buffer.from("\x89PNG\x00changed", "latin1"));
    expect(git(repo, "show", "pyro/fix:src/app.py")).toBe("def add(a, b):\n    return a + b\n");
    expect(
      git(repo, "ls-tree", "pyro/fix", "tool.sh", "app_link")
        .split("\n")
        .filter(Boolean)
        .map((l) => l.split(" ")[0]),
    ).toEqual(["120000", "100755"]);
    // The host's dirty state stays out of the commit (only the agent's changes are in it).
    expect(git(repo, "show", "pyro/fix:README.md")).toBe("# demo\nmore\n");
    expect(git(repo, "ls-tree", "--name-only", "pyro/fix").split("\n")).not.toContain("notes.txt");
    // Nothing else on the host moved: working tree, index, HEAD, other refs, config.
    expect(await hostState(repo, "pyro/fix")).toEqual(before);

    // An existing branch is refused; --force moves it (never the checked-out one).
    expect(await code(pyro.commitWorkspace(id, { branch: "pyro/fix" }))).toBe("conflict");
    expect(await code(pyro.commitWorkspace(id, { branch: "main", force: true }))).toBe("conflict");
    await pyro.writeWorkspaceFile(id, "src/app.py", "def add(a, b):\n    return b + a\n");
    const again = await pyro.commitWorkspace(id, { branch: "pyro/fix", force: true });
    expect(again.replaced).toBe(c.commit);
    expect(git(repo, "rev-parse", "pyro/fix^").trim()).toBe(seedCommit);
    expect(git(repo, "show", "pyro/fix:src/app.py")).toBe("def add(a, b):\n    return b + a\n");
    // Bad names are invalid_argument, with nothing written.
    expect(await code(pyro.commitWorkspace(id, { branch: "bad..name" }))).toBe("invalid_argument");
    expect(await code(pyro.commitWorkspace(id, { branch: "-x" }))).toBe("invalid_argument");
    // The default branch is pyro/<name>.
    const def = await pyro.commitWorkspace(id);
    expect(def.branch).toBe(`pyro/${w.name}`);
    expect(await hostState(repo, "pyro")).toEqual(before);
    expect(git(repo, "rev-parse", "HEAD").trim()).toBe(seedCommit);
  } finally {
    await pyro.deleteWorkspace(id).catch(() => {});
  }
}

/** A workspace seeded from a plain directory: commit is `conflict` with a hint. */
export async function notFromGit(
  pyro: Pyro,
  dir: string,
  createOptions: Parameters<Pyro["createWorkspace"]>[0],
) {
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, "a.txt"), "a\n");
  await chmod(join(dir, "a.txt"), 0o644);
  const w = await pyro.createWorkspace({ ...createOptions, seedPath: dir });
  try {
    const err = await pyro.commitWorkspace(w.workspace_id).then(
      () => null,
      (e: PyroError) => e,
    );
    expect(err?.code).toBe("conflict");
    expect(err?.hint).toMatch(/Git checkout|--repo-url/);
  } finally {
    await pyro.deleteWorkspace(w.workspace_id).catch(() => {});
  }
}
