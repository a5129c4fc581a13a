import { mkdtemp, readdir, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { PyroError } from "../../../src/errors.js";
import { Pyro } from "../../../src/sdk/pyro.js";
import { SIGNATURES } from "../../../src/sdk/schemas.js";
import { fakePyro } from "../../helpers/engine.js";

let t: Awaited<ReturnType<typeof fakePyro>>;
let pyro: Pyro;
let seed: string;
let outDir: string;
let id: string;

beforeEach(async () => {
  t = await fakePyro();
  pyro = t.pyro;
  seed = await mkdtemp(join(tmpdir(), "pyro-seed-"));
  outDir = await mkdtemp(join(tmpdir(), "pyro-out-"));
  await writeFile(join(seed, "app.py"), "print('hello')\n");
  const w = await pyro.createWorkspace({ seedPath: seed, name: "w1", labels: { team: "a" } });
  id = w.workspace_id;
  await pyro.execWorkspace(id, "true");
});
afterEach(async () => {
  await t.cleanup();
  await rm(seed, { recursive: true, force: true });
  await rm(outDir, { recursive: true, force: true });
});

/** Methods that take no arguments: nothing to validate. */
const NO_ARGUMENTS = ["close", "listEnvironments", "listWorkspaces"];

/** Calls the SDK the way JavaScript (or a cast) can: with any values at all. */
function call(method: string, ...args: unknown[]): Promise<unknown> {
  return (pyro as unknown as Record<string, (...a: unknown[]) => Promise<unknown>>)[method]!(...args);
}

/**
 * Everything a call could change, read without touching the workspace (the SDK's reads
 * go through the agent and move last_activity_at): the store's rows, events and command
 * counts, the sandboxes the backend started, every file under the home and the export
 * directory (paths, sizes and mtimes; the SQLite files are covered by the rows).
 */
async function everything(): Promise<unknown> {
  const store = pyro.engine.store();
  return {
    workspaces: store.listWorkspaces(),
    events: store.listWorkspaces().map((w) => store.countEvents(w.workspace_id)),
    commands: store.listWorkspaces().map((w) => store.countCommands(w.workspace_id)),
    started: [...t.backend.started],
    home: await tree(t.home),
    out: await tree(outDir),
  };
}

async function tree(root: string): Promise<string[]> {
  const entries = await readdir(root, { recursive: true });
  const out: string[] = [];
  for (const e of entries.sort()) {
    if (/state\.db|\.sqlite|-wal$|-shm$|\.db$/.test(e)) continue;
    const s = await stat(join(root, e)).catch(() => null);
    if (s) out.push(`${relative(root, join(root, e))} ${s.isDirectory() ? "dir" : s.size} ${s.mtimeMs}`);
  }
  return out;
}

async function refusal(p: Promise<unknown>): Promise<PyroError> {
  const err = await p.then(
    () => {
      throw new Error("expected the call to be refused");
    },
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(PyroError);
  return err as PyroError;
}

/** One wrong call per method (at least): [method, arguments, what the message must say]. */
const BAD_CALLS: [string, () => unknown[], string][] = [
  ["doctor", () => [{ environment: 12 }], "doctor: options.environment must be a string, got 12"],
  [
    "pullEnvironment",
    () => [["debian:12"]],
    "pullEnvironment: name must be a string, got an array of 1 item",
  ],
  [
    "pullEnvironment",
    () => ["debian:12", { signal: "later" }],
    'pullEnvironment: options.signal must be an AbortSignal, got "later"',
  ],
  ["inspectEnvironment", () => [undefined], "inspectEnvironment: name must be a string, got undefined"],
  [
    "buildEnvironment",
    () => [{ name: "x", from: "debian:12", apt: "jq" }],
    "buildEnvironment: recipe.apt must be",
  ],
  [
    "buildEnvironment",
    () => [{ name: "x", from: "debian:12", run: ["true"], steps: [] }],
    "buildEnvironment: recipe",
  ],
  // `all: "no"` is truthy: before the check it pruned everything.
  [
    "pruneEnvironments",
    () => [{ all: "no" }],
    'pruneEnvironments: options.all must be true or false, got "no"',
  ],
  ["run", () => ["debian:12", ["echo", "hi"]], "run: command must be a string, got an array of 2 items"],
  ["run", () => ["debian:12", "true", { vcpus: 0 }], "run: options.vcpus must be at least 1, got 0"],
  ["demo", () => [{ backend: "kvm" }], "demo: options.backend must be one of firecracker, qemu, gvisor"],
  ["prepare", () => ["debian:12", { force: 1 }], "prepare: options.force must be true or false, got 1"],
  [
    "createWorkspace",
    () => [{ seedPath: seed, vcpus: "2" }],
    'createWorkspace: options.vcpus must be a number, got "2"',
  ],
  ["createWorkspace", () => ["w2"], 'createWorkspace: options must be an object or undefined, got "w2"'],
  [
    "createWorkspace",
    () => [{ memoryMib: 512.5 }],
    "createWorkspace: options.memoryMib must be a whole number, got 512.5",
  ],
  ["getWorkspace", () => [42], "getWorkspace: workspaceId must be a string, got 42"],
  [
    "getWorkspace",
    () => [{ workspace_id: id }],
    "getWorkspace: workspaceId must be a string, got an object {workspace_id}",
  ],
  [
    "updateWorkspace",
    () => [id, { labels: ["a"] }],
    "updateWorkspace: patch.labels must be an object, got an array of 1 item",
  ],
  ["updateWorkspace", () => [id], "updateWorkspace: patch must be an object, got undefined"],
  [
    "updateWorkspace",
    () => [id, { networkPolicy: 7 }],
    "updateWorkspace: patch.networkPolicy must be a string, got 7",
  ],
  ["networkBlocks", () => [42], "networkBlocks: workspaceId must be a string, got 42"],
  ["approveNetwork", () => [id], "approveNetwork: target must be a string, got undefined"],
  ["approveNetwork", () => [id, "x".repeat(301)], "approveNetwork: target must be at most 300 characters"],
  ["startService", () => [id, "web", "   "], "startService: command must not be empty or blank"],
  [
    "startService",
    () => [id, "web", "sleep 60", { readiness: { type: "tcp", port: 0 } }],
    "startService: options.readiness.port must be at least 1, got 0",
  ],
  [
    "startService",
    () => [id, "web", "sleep 60", { readiness: { type: "tcp", port: 70000 } }],
    "startService: options.readiness.port must be at most 65535",
  ],
  [
    "startService",
    () => [id, "web", "sleep 60", { ready_timeout_seconds: 5 }],
    'startService: options has unknown key "ready_timeout_seconds"',
  ],
  ["startService", () => [id, "no spaces", "sleep 60"], "startService: name must be 1-63 letters"],
  ["listServices", () => [42], "listServices: workspaceId must be a string, got 42"],
  ["serviceStatus", () => [id], "serviceStatus: name must be a string, got undefined"],
  [
    "serviceLogs",
    () => [id, "web", { tailLines: 0 }],
    "serviceLogs: options.tailLines must be at least 1, got 0",
  ],
  [
    "stopService",
    () => [id, "web", { graceSeconds: 61 }],
    "stopService: options.graceSeconds must be at most 60",
  ],
  ["openShell", () => [id, { cols: 0 }], "openShell: options.cols must be at least 1, got 0"],
  ["openShell", () => [id, { rows: 201 }], "openShell: options.rows must be at most 200"],
  ["writeShell", () => [id, "sh_zz", "ls"], "writeShell: shellId shell ids look like sh_ and 12 hex digits"],
  ["writeShell", () => [id, "sh_0123456789ab", 42], "writeShell: input must be a string, got 42"],
  [
    "readShell",
    () => [id, "sh_0123456789ab", { waitForIdleMs: 10_001 }],
    "readShell: options.waitForIdleMs must be at most 10000",
  ],
  [
    "readShell",
    () => [id, "sh_0123456789ab", { wait_for_idle_ms: 5 }],
    'readShell: options has unknown key "wait_for_idle_ms"',
  ],
  ["signalShell", () => [id, "sh_0123456789ab", "HUP"], "signalShell: signal must be"],
  ["resizeShell", () => [id, "sh_0123456789ab", 80, -1], "resizeShell: rows must be at least 1, got -1"],
  ["closeShell", () => [id], "closeShell: shellId must be a string, got undefined"],
  ["listShells", () => [null], "listShells: workspaceId must be a string, got null"],
  [
    "createWorkspace",
    () => [{ publishedPorts: [{ host_port: 0, guest_port: 0 }] }],
    "createWorkspace: options.publishedPorts",
  ],
  [
    "deleteWorkspace",
    () => [{ workspace_id: id }],
    "deleteWorkspace: workspaceId must be a string, got an object {workspace_id}",
  ],
  ["stopWorkspace", () => [null], "stopWorkspace: workspaceId must be a string, got null"],
  ["startWorkspace", () => [7], "startWorkspace: workspaceId must be a string, got 7"],
  // The issue: an MCP-shaped call crashed with `TypeError: command.trim is not a function`.
  [
    "execWorkspace",
    () => [id, { command: "echo x > y" }],
    "execWorkspace: command must be a string, got an object {command}",
  ],
  [
    "execWorkspace",
    () => [id, "touch y", { timeoutSeconds: "5" }],
    'execWorkspace: options.timeoutSeconds must be a number, got "5"',
  ],
  [
    "execWorkspace",
    () => [id, "touch y", { timeoutSeconds: Number.NaN }],
    "execWorkspace: options.timeoutSeconds must be a finite number, got NaN",
  ],
  [
    "execWorkspace",
    () => [id, "touch y", { timeoutSeconds: Number.POSITIVE_INFINITY }],
    "execWorkspace: options.timeoutSeconds must be a finite number, got Infinity",
  ],
  [
    "execWorkspace",
    () => [id, "touch y", { timeoutSeconds: 86_401 }],
    "execWorkspace: options.timeoutSeconds must be at most 86400, got 86401",
  ],
  [
    "execWorkspace",
    () => [id, "touch y", { maxOutputBytes: 1.5 }],
    "execWorkspace: options.maxOutputBytes must be a whole number, got 1.5",
  ],
  [
    "execWorkspace",
    () => [id, "touch y", null],
    "execWorkspace: options must be an object or undefined, got null",
  ],
  [
    "execWorkspace",
    () => [id, "touch y", { env: { "NOT A NAME": "x" } }],
    'execWorkspace: options.env has an invalid key "NOT A NAME": environment variable names are letters',
  ],
  [
    "execWorkspace",
    () => [id, "touch y", { env: { A: 1 } }],
    "execWorkspace: options.env.A must be a string, got 1",
  ],
  [
    "execWorkspace",
    () => [id, "touch y", { signal: { aborted: false } }],
    "execWorkspace: options.signal must be an AbortSignal, got an object {aborted}",
  ],
  [
    "execWorkspace",
    () => [id, "touch y", { onOutput: "log" }],
    "execWorkspace: options.onOutput must be a function",
  ],
  ["execWorkspace", () => [id, "   "], 'execWorkspace: command must not be empty or blank, got "   "'],
  ["workspaceLogs", () => [id, { seq: 1.5 }], "workspaceLogs: options.seq must be a whole number, got 1.5"],
  [
    "workspaceLogs",
    () => [id, { limit: 1001 }],
    "workspaceLogs: options.limit must be at most 1000, got 1001",
  ],
  ["summarizeWorkspace", () => [{}], "summarizeWorkspace: workspaceId must be a string, got an empty object"],
  [
    "listWorkspaceFiles",
    () => [id, { recursive: true }],
    "listWorkspaceFiles: path must be a string, got an object {recursive}",
  ],
  [
    "readWorkspaceFile",
    () => [id, "app.py", { maxBytes: -1 }],
    "readWorkspaceFile: options.maxBytes must be at least 0, got -1",
  ],
  [
    "writeWorkspaceFile",
    () => [id, "app.py", { text: "changed" }],
    "writeWorkspaceFile: content must be a string or a Buffer, got an object {text}",
  ],
  ["writeWorkspaceFile", () => [id, "", "x"], "writeWorkspaceFile: path must not be empty"],
  [
    "applyWorkspacePatch",
    () => [id, { patch: "--- a/app.py\n+++ b/app.py\n" }],
    "applyWorkspacePatch: patch must be a string, got an object {patch}",
  ],
  ["diffWorkspace", () => [id, "cp1"], 'diffWorkspace: options must be an object or undefined, got "cp1"'],
  ["commitWorkspace", () => [id, { branch: 7 }], "commitWorkspace: options.branch must be a string, got 7"],
  [
    "commitWorkspace",
    () => [id, { force: "yes" }],
    'commitWorkspace: options.force must be true or false, got "yes"',
  ],
  [
    "exportWorkspace",
    () => [id, "app.py", { outputPath: "x" }],
    "exportWorkspace: outputPath must be a string, got an object {outputPath}",
  ],
  ["listWorkspaceDisk", () => [id, 7], "listWorkspaceDisk: path must be a string, got 7"],
  ["readWorkspaceDisk", () => [id], "readWorkspaceDisk: path must be a string, got undefined"],
  [
    "exportWorkspaceDisk",
    () => [id, "app.py", { outputPath: "x" }],
    "exportWorkspaceDisk: outputPath must be a string, got an object {outputPath}",
  ],
  [
    "syncPushWorkspace",
    () => [id, seed, { dest: 5 }],
    "syncPushWorkspace: options.dest must be a string, got 5",
  ],
  [
    "resetWorkspace",
    () => [id, "baseline"],
    'resetWorkspace: options must be an object or undefined, got "baseline"',
  ],
  [
    "createSnapshot",
    () => [id, { name: "cp1" }],
    "createSnapshot: name must be a string, got an object {name}",
  ],
  ["listSnapshots", () => [7], "listSnapshots: workspaceId must be a string, got 7"],
  ["deleteSnapshot", () => [id, null], "deleteSnapshot: name must be a string, got null"],
];

describe("SDK argument checks", () => {
  it("has a signature for every public method that takes arguments", () => {
    const methods = Object.getOwnPropertyNames(Pyro.prototype).filter(
      (m) => m !== "constructor" && !NO_ARGUMENTS.includes(m),
    );
    expect(Object.keys(SIGNATURES).sort()).toEqual(methods.sort());
    expect([...new Set(BAD_CALLS.map(([m]) => m))].sort()).toEqual(methods.sort());
  });

  it.each(BAD_CALLS.map(([m, args, message], i) => [`${m} #${i}`, m, args, message] as const))(
    "%s: refuses a wrong argument with invalid_argument and changes nothing",
    async (_label, method, args, message) => {
      const before = await everything();
      const err = await refusal(call(method, ...args()));
      expect(err.code).toBe("invalid_argument");
      expect(err.message.startsWith(message), `${err.message}\n  should start with\n${message}`).toBe(true);
      expect(err.hint).toEqual(expect.any(String));
      expect(await everything()).toEqual(before);
      expect(t.backend.started).toHaveLength(1);
    },
  );

  it("rejects the promise rather than throwing synchronously", async () => {
    let p: Promise<unknown> | undefined;
    expect(() => {
      p = call("execWorkspace", id, { command: "true" });
    }).not.toThrow();
    expect((await refusal(p!)).code).toBe("invalid_argument");
  });

  it("refuses unknown option keys and suggests the spelling the method takes", async () => {
    const before = await everything();
    const typo = await refusal(call("execWorkspace", id, "touch y", { timeout: 5 }));
    expect(typo.message).toBe('execWorkspace: options has unknown key "timeout"');
    expect(typo.hint).toContain("timeoutSeconds");
    const snake = await refusal(call("run", "debian:12", "true", { timeout_seconds: 5 }));
    expect(snake.message).toBe('run: options has unknown key "timeout_seconds"');
    expect(snake.hint).toMatch(/^did you mean timeoutSeconds\? SDK option keys are camelCase; /);
    const patchKey = await refusal(call("updateWorkspace", id, { clear_labels: ["team"] }));
    expect(patchKey.hint).toMatch(/^did you mean clearLabels\?/);
    expect(await everything()).toEqual(before);
  });

  /** Valid positional arguments per parameter name, so that only the option key is wrong. */
  const POSITIONAL: Record<string, () => unknown> = {
    workspaceId: () => id,
    environment: () => "debian:12",
    name: () => "cp1",
    command: () => "touch y",
    path: () => "app.py",
    outputPath: () => join(outDir, "x"),
    source: () => seed,
    shellId: () => "sh_0123456789ab",
  };

  it("refuses the snake_case spelling of every camelCase option and names the camelCase one", async () => {
    const before = await everything();
    let checked = 0;
    for (const [method, params] of Object.entries(SIGNATURES)) {
      const last = params.length - 1;
      const shape = (params[last]!.schema as { shape?: Record<string, unknown> }).shape;
      if (!shape) continue;
      for (const key of Object.keys(shape).filter((k) => /[A-Z]/.test(k))) {
        const snakeKey = key.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
        const args = params.slice(0, last).map((p) => POSITIONAL[p.name]!());
        const err = await refusal(call(method, ...args, { [snakeKey]: 1 }));
        expect(err.message).toBe(`${method}: ${params[last]!.name} has unknown key "${snakeKey}"`);
        expect(err.hint).toMatch(new RegExp(`^did you mean ${key}\\? SDK option keys are camelCase`));
        checked++;
      }
    }
    // timeoutSeconds, maxOutputBytes, memoryMib, seedPath... across run, createWorkspace, execWorkspace, ...
    expect(checked).toBeGreaterThan(20);
    expect(await everything()).toEqual(before);
  });

  it("never echoes a huge input back", async () => {
    const huge = "x".repeat(1_000_000);
    const cases: unknown[][] = [
      ["createSnapshot", id, huge],
      ["execWorkspace", id, "true", { cwd: [huge] }],
      ["execWorkspace", id, "true", { [huge]: 1, [`${huge}y`]: 2, a: 3, b: 4 }],
      ["execWorkspace", id, "true", { env: { [`${huge}-`]: "x" } }],
      ["createWorkspace", { labels: { a: huge.length, [huge]: 1 } }],
      ["getWorkspace", { [huge]: huge }],
    ];
    for (const [method, ...args] of cases) {
      const err = await refusal(call(method as string, ...args));
      expect(err.code).toBe("invalid_argument");
      expect(err.message.length, err.message.slice(0, 400)).toBeLessThan(300);
      expect((err.hint ?? "").length).toBeLessThan(600);
    }
    const clipped = await refusal(call("createSnapshot", id, huge));
    expect(clipped.message).toBe(
      `createSnapshot: name must be at most 63 characters long, got "${"x".repeat(80)}"… (1000000 characters)`,
    );
  });

  it("passes valid calls through, with the camelCase options the SDK documents", async () => {
    const signal = new AbortController().signal;
    const seen: unknown[] = [];
    const exec = await pyro.execWorkspace(id, "echo $GREETING", {
      timeoutSeconds: 30,
      cwd: "/workspace",
      env: { GREETING: "hi" },
      maxOutputBytes: 2048,
      signal,
      onOutput: (c) => seen.push(c),
    });
    expect(exec).toMatchObject({ exit_code: 0, stdout: "hi\n" });
    // The camelCase options reach the core: the listener saw the output, the cap cut it.
    expect(seen.length).toBeGreaterThan(0);
    const long = await pyro.execWorkspace(id, "head -c 5000 /dev/zero | tr '\\0' x", {
      maxOutputBytes: 1024,
    });
    expect(long).toMatchObject({ truncated: true, stdout_bytes: 5000 });
    expect(
      (await pyro.execWorkspace(id, "true", { timeoutSeconds: 5, maxOutputBytes: 4096 })).exit_code,
    ).toBe(0);
    expect((await pyro.execWorkspace(id, "true", undefined)).exit_code).toBe(0);
    expect((await pyro.workspaceLogs(id, { limit: 2 })).commands).toHaveLength(2);
    expect((await pyro.workspaceLogs(id, { seq: 2, maxOutputBytes: 1024 })).commands[0]?.stdout).toBe("hi\n");
    expect((await pyro.getWorkspace("w1")).workspace_id).toBe(id);
    expect((await pyro.getWorkspace(id)).name).toBe("w1");
    expect(
      (await pyro.updateWorkspace(id, { name: "w2", labels: { stage: "x" }, clearLabels: ["team"] })).labels,
    ).toEqual({ stage: "x" });
    expect((await pyro.listWorkspaceFiles(id)).entries.map((e) => e.path)).toContain("app.py");
    expect(
      (await pyro.listWorkspaceFiles(id, undefined, { recursive: true })).entries.length,
    ).toBeGreaterThan(0);
    expect((await pyro.writeWorkspaceFile(id, "a.txt", "text\n")).size_bytes).toBe(5);
    // Any Uint8Array is bytes (before, a bare Uint8Array was written as "1,2,3").
    await pyro.writeWorkspaceFile(id, "b.bin", new Uint8Array([104, 105]));
    expect((await pyro.readWorkspaceFile(id, "b.bin", { maxBytes: 10 })).content).toBe("hi");
    await pyro.writeWorkspaceFile(id, "c.bin", Buffer.from("yo"));
    expect((await pyro.readWorkspaceFile(id, "c.bin")).content).toBe("yo");
    const patched = await pyro.applyWorkspacePatch(
      id,
      "--- a/app.py\n+++ b/app.py\n@@ -1 +1 @@\n-print('hello')\n+print('bye')\n",
    );
    expect(patched.changed).toBe(true);
    expect((await pyro.createSnapshot(id, "cp1")).snapshot_name).toBe("cp1");
    expect((await pyro.diffWorkspace(id, { snapshot: "cp1" })).changed).toBe(false);
    expect((await pyro.diffWorkspace(id)).changed).toBe(true);
    expect((await pyro.listSnapshots(id)).count).toBe(2);
    const out = join(outDir, "app.py");
    expect((await pyro.exportWorkspace(id, "app.py", out, { signal })).output_path).toBe(out);
    expect((await pyro.syncPushWorkspace(id, seed, { dest: "/workspace/pushed", signal })).files).toBe(1);
    expect((await pyro.resetWorkspace(id, { snapshot: "cp1" })).workspace_reset.snapshot_name).toBe("cp1");
    expect((await pyro.resetWorkspace(id)).workspace_reset.snapshot_name).toBe("baseline");
    expect((await pyro.deleteSnapshot(id, "cp1")).deleted).toBe(true);
    expect((await pyro.summarizeWorkspace(id)).outcome.command_count).toBeGreaterThan(0);
    expect((await pyro.stopWorkspace(id)).state).toBe("stopped");
    expect((await pyro.startWorkspace(id)).state).toBe("running");

    const created = await pyro.createWorkspace({
      environment: "debian:12",
      seedPath: seed,
      name: "w3",
      labels: { a: "b" },
      env: { A: "1" },
      backend: "bwrap",
      vcpus: 2,
      memoryMib: 512,
      ttlSeconds: null,
      networkPolicy: "off",
      signal,
    });
    expect(created).toMatchObject({ name: "w3", expires_at: null, limits: { vcpus: 2, memory_mib: 512 } });
    expect((await pyro.deleteWorkspace("w3")).deleted).toBe(true);

    expect(
      (await pyro.run("debian:12", "echo one", { timeoutSeconds: 30, maxOutputBytes: 2048 })).stdout,
    ).toBe("one\n");
    expect((await pyro.pullEnvironment("debian:12", { signal })).name).toBe("debian:12");
    expect((await pyro.inspectEnvironment("debian:12")).name).toBe("debian:12");
    expect((await pyro.pruneEnvironments({ all: false })).removed).toEqual([]);
    expect((await pyro.prepare("debian:12", { backend: "bwrap", force: false })).environment).toBe(
      "debian:12",
    );
    expect(await pyro.demo({ backend: "bwrap" })).toBeDefined();
    expect(await pyro.doctor({ environment: "debian:12" })).toBeDefined();
  });
});
