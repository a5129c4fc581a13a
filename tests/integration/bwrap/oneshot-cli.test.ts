import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pyro as cli } from "../../helpers/cli.js";
import {
  bwrapSkipReason,
  entriesOf,
  type Harness,
  hostProcesses,
  mountsMentioning,
  openHarness,
  procStat,
  suiteTitle,
  writeTree,
} from "../../helpers/sandbox.js";

/** One-shot runs (SDK and CLI) and the workspace loop driven entirely through the CLI, on bwrap. */

/**
 * Waits (at most 5 s) for the detached cleaners of the CLI's one-shots under `home`
 * (backends/linux/oneshot-cleaner.ts): `pyro run` answers before its leftovers are gone.
 */
async function cleanersDone(home: string): Promise<void> {
  const running = () =>
    hostProcesses((argv) => argv.includes("pyro-clean") && argv.some((a) => a.includes(home)));
  for (const deadline = Date.now() + 5_000; running().length > 0 && Date.now() < deadline; )
    await new Promise((r) => setTimeout(r, 20));
  expect(running()).toEqual([]);
}
const skip = bwrapSkipReason();

describe.skipIf(skip !== "")(suiteTitle("one-shot runs and the CLI on bwrap", skip), () => {
  let h: Harness;
  let env: NodeJS.ProcessEnv;

  beforeAll(async () => {
    h = await openHarness("oneshot");
    // Pin the backend through the environment so the CLI command lines stay as a user types them.
    env = { ...h.cliEnv, PYRO_BACKEND: "bwrap" };
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("runs git --version once and leaves no workspace, directory or mount behind", async () => {
    const r = await h.pyro.run("debian:12", "git --version", { backend: "bwrap" });
    expect(r).toMatchObject({
      environment: "debian:12",
      backend: "bwrap",
      execution_mode: "guest_agent",
      exit_code: 0,
      timed_out: false,
    });
    expect(r.stdout).toMatch(/^git version \d+\.\d+/);
    expect((await h.pyro.listWorkspaces()).count).toBe(0);
    expect(await entriesOf(join(h.home, "workspaces"))).toEqual([]);
    expect(mountsMentioning(h.home)).toEqual([]);
    expect(hostProcesses((argv) => argv.some((a) => a.includes(h.home)))).toEqual([]);
  });

  it("pyro run --network egress gives the command the proxy and leaves no workspace or helper behind", async () => {
    const r = cli(
      ["run", "debian:12", "--network", "egress", "--", "sh", "-c", 'echo "$HTTPS_PROXY $no_proxy"'],
      env,
    );
    expect(r.stderr).toBe("");
    expect(r.stdout).toBe("http://127.0.0.1:3128 localhost,127.0.0.1,::1\n");
    expect(r.code).toBe(0);
    const off = cli(["run", "debian:12", "--", "sh", "-c", 'echo "[$HTTPS_PROXY]"'], env);
    expect(off.stdout).toBe("[]\n");
    await cleanersDone(h.home);
    expect(hostProcesses((argv) => argv.some((a) => a.includes(h.home)))).toEqual([]);
    const bad = cli(["run", "debian:12", "--network", "allowlist:", "--", "true"], env);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toMatch(/network allowlist is empty/);
  });

  it("pyro run answers with nothing of its sandbox running; a detached cleaner then removes the run's directory", async () => {
    // The command leaves a process behind that holds none of the sandbox's streams.
    const r = cli(["run", "debian:12", "--", "sh", "-c", "sleep 77 >/dev/null 2>&1 & echo started"], env);
    expect([r.code, r.stdout]).toEqual([0, "started\n"]);
    const alive = hostProcesses((argv) => argv.join(" ") === "sleep 77").filter(
      (p) => procStat(p.pid)?.state !== "Z",
    );
    expect(alive).toEqual([]);
    await cleanersDone(h.home);
    expect(await entriesOf(join(h.home, "oneshot"))).toEqual([]);
    expect(mountsMentioning(h.home)).toEqual([]);
  });

  it("pyro run prints the command's own output and exits 0", () => {
    const r = cli(["run", "debian:12", "--", "git", "--version"], env);
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^git version \d+\.\d+\.\d+\n$/);
  });

  it("pyro run --json returns the structured result", () => {
    const r = cli(["run", "debian:12", "--json", "--", "git", "--version"], env);
    expect(r.code).toBe(0);
    const out = r.json();
    expect(Object.keys(out).sort()).toEqual(
      [
        "backend",
        "duration_ms",
        "environment",
        "execution_mode",
        "exit_code",
        "stderr",
        "stderr_bytes",
        "stdout",
        "stdout_bytes",
        "timed_out",
        "total_ms",
        "truncated",
      ].sort(),
    );
    expect(out).toMatchObject({
      environment: "debian:12",
      backend: "bwrap",
      execution_mode: "guest_agent",
      exit_code: 0,
      stderr: "",
      timed_out: false,
      truncated: false,
    });
    expect(out.stdout).toMatch(/^git version /);
    expect(out.total_ms).toBeGreaterThanOrEqual(out.duration_ms);
  });

  it("pyro run --max-output-bytes keeps the head and the tail of a long output", () => {
    const r = cli(
      ["run", "debian:12", "--json", "--max-output-bytes", "4k", "--", "seq", "1", "200000"],
      env,
    );
    expect(r.code, r.stderr).toBe(0);
    const out = r.json();
    expect(out).toMatchObject({ stdout_bytes: 1288895, truncated: true });
    expect(out.stdout.startsWith("1\n2\n")).toBe(true);
    expect(out.stdout.endsWith("199999\n200000\n")).toBe(true);
    expect(out.stdout).toContain(`[... ${1288895 - 4096} bytes omitted ...]`);
    const bad = cli(["run", "debian:12", "--max-output-bytes", "lots", "--", "true"], env);
    expect([bad.code, bad.stdout]).toEqual([1, ""]);
    expect(bad.stderr).toMatch(/^pyro: error \[invalid_argument\]: --max-output-bytes .*\n$/);
  });

  it("pyro run exits with the failing command's exit code, with or without --json", async () => {
    const human = cli(["run", "debian:12", "--", "sh", "-c", "echo boom >&2; exit 7"], env);
    expect(human.code).toBe(7);
    expect(human.stderr).toContain("boom");
    const json = cli(["run", "debian:12", "--json", "--", "sh", "-c", "exit 7"], env);
    expect(json.code).toBe(7);
    expect(json.json().exit_code).toBe(7);
    expect((await h.pyro.listWorkspaces()).count).toBe(0);
  });

  it("drives a whole workspace loop through the CLI: create, exec, write, patch, diff, export, reset, delete", async () => {
    const host = await h.tempDir("oneshot-host");
    const seed = join(host, "seed");
    await writeTree(seed, { "calc.py": "def add(a, b):\n    return a - b\n" });
    const todo = join(host, "todo.md");
    await writeFile(todo, "- fix add\n");
    const patchFile = join(host, "fix.patch");
    await writeFile(
      patchFile,
      [
        "--- a/calc.py",
        "+++ b/calc.py",
        "@@ -1,2 +1,2 @@",
        " def add(a, b):",
        "-    return a - b",
        "+    return a + b",
        "",
      ].join("\n"),
    );

    const created = cli(["workspace", "create", "debian:12", "--seed-path", seed, "--id-only"], env);
    expect(created.stderr).toBe("");
    expect(created.stdout).toMatch(/^ws_[0-9a-f]{12}\n$/);
    const id = created.stdout.trim();
    const at = `workspace ${id}`;

    const cat = cli(["workspace", "exec", id, "--", "cat", "calc.py"], env);
    expect(cat.code, at).toBe(0);
    expect(cat.stdout).toBe("def add(a, b):\n    return a - b\n");
    const failing = cli(
      [
        "workspace",
        "exec",
        id,
        "--json",
        "--",
        "python3",
        "-B",
        "-c",
        "from calc import add; assert add(2, 3) == 5",
      ],
      env,
    );
    expect(failing.code, at).toBe(1);
    expect(failing.json()).toMatchObject({ workspace_id: id, exit_code: 1, execution_mode: "guest_agent" });

    const wrote = cli(
      ["workspace", "file", "write", id, "notes/todo.md", "--text-file", todo, "--json"],
      env,
    );
    expect(wrote.code, `${at}: ${wrote.stderr}`).toBe(0);
    expect(wrote.json()).toMatchObject({ path: "notes/todo.md", size_bytes: 10, created: true });

    const patched = cli(["workspace", "patch", "apply", id, "--patch-file", patchFile, "--json"], env);
    expect(patched.code, `${at}: ${patched.stderr}`).toBe(0);
    expect(patched.json()).toMatchObject({ changed: true, files: [{ path: "calc.py", status: "modified" }] });
    expect(
      cli(
        ["workspace", "exec", id, "--", "python3", "-B", "-c", "from calc import add; assert add(2, 3) == 5"],
        env,
      ).code,
      at,
    ).toBe(0);

    const diff = cli(["workspace", "diff", id, "--json"], env);
    expect(diff.code, at).toBe(0);
    expect(diff.json()).toMatchObject({
      changed: true,
      summary: { total: 2, added: 1, modified: 1, deleted: 0 },
      entries: [
        { path: "calc.py", status: "modified" },
        { path: "notes/todo.md", status: "added" },
      ],
    });
    expect(diff.json().patch).toContain("+    return a + b");

    const out = join(host, "exported-notes");
    const exported = cli(["workspace", "export", id, "notes", "--output", out, "--json"], env);
    expect(exported.code, `${at}: ${exported.stderr}`).toBe(0);
    expect(exported.json()).toMatchObject({ output_path: out, artifact_type: "directory" });
    expect(await readFile(join(out, "todo.md"), "utf8")).toBe("- fix add\n");

    const reset = cli(["workspace", "reset", id, "--json"], env);
    expect(reset.code, at).toBe(0);
    expect(reset.json()).toMatchObject({
      workspace_id: id,
      reset_count: 1,
      workspace_reset: { snapshot_name: "baseline" },
    });
    expect(cli(["workspace", "diff", id, "--json"], env).json()).toMatchObject({
      changed: false,
      summary: { total: 0 },
    });

    const deleted = cli(["workspace", "delete", id, "--json"], env);
    expect(deleted.code, at).toBe(0);
    expect(deleted.json()).toMatchObject({ workspace_id: id, deleted: true });
    expect(cli(["workspace", "list", "--json"], env).json()).toMatchObject({ count: 0, workspaces: [] });
    expect(await entriesOf(join(h.home, "workspaces"))).toEqual([]);
  });

  it("reports an unknown workspace as workspace_not_found with exit 1 and a JSON error", () => {
    const r = cli(["workspace", "exec", "ws_000000000000", "--json", "--", "true"], env);
    expect(r.code).toBe(1);
    expect(r.json()).toMatchObject({ error: { code: "workspace_not_found" } });
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
  });
});
