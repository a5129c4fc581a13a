import { execFileSync } from "node:child_process";
import { chmodSync, existsSync, linkSync, mkdirSync, symlinkSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Readable } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { workspaceWriter } from "../../../src/backends/bwrap/unpack.js";
import {
  bwrapSkipReason,
  type Harness,
  hostProcesses,
  openHarness,
  suiteTitle,
} from "../../helpers/sandbox.js";
import { lastVia, refusalOf } from "../../helpers/transfer.js";

/**
 * The fast push into a running bwrap workspace (core/push-direct.ts, bwrap/unpack.ts):
 * the host's GNU tar packs, GNU tar in a sandbox that sees only the workspace's tree
 * extracts. It must make exactly what the agent's `tar_in` makes, take only what the
 * host's checks accept, and leave every other push (and every refusal) to the agent.
 */
const skip = bwrapSkipReason();

describe.skipIf(skip !== "")(suiteTitle("bwrap fast push (no agent relay)", skip), () => {
  let h: Harness;
  let id: string;
  let src: string;
  const sh = async (command: string, ws = id) => {
    const r = await h.pyro.execWorkspace(ws, command);
    expect(r.exit_code, `\`${command}\` failed: ${r.stderr}`).toBe(0);
    return r.stdout.trim();
  };
  /** How the last push into `ws` went: `tar` (this path) or `agent`. */
  const pushVia = (ws = id) => lastVia(h, ws, "sync_push");
  /** Every entry under /workspace/`dir`: path, type, mode, owner, size, mtime and link target. */
  const listing = (dir: string) =>
    sh(`cd ${dir} && find . -mindepth 1 -printf '%P %y %m %u %s %T@ %l\\n' | sort`);
  const refusal = refusalOf;

  beforeAll(async () => {
    h = await openHarness("push-direct");
    id = (await h.create({})).workspace_id;
    src = await h.tempDir("push-direct-src");
    const t = join(src, "tree");
    const long = "n".repeat(120);
    mkdirSync(join(t, "sub", "deep"), { recursive: true });
    mkdirSync(join(t, "empty"));
    mkdirSync(join(t, long, long), { recursive: true });
    writeFileSync(join(t, "a.txt"), "hello\n");
    writeFileSync(join(t, "sub", "deep", "blob.bin"), Buffer.alloc(300_000, 7));
    writeFileSync(join(t, long, long, `${long}.txt`), "long\n");
    for (const [name, mode] of [
      ["exec.sh", 0o755],
      ["open", 0o777],
      ["private", 0o600],
      ["setuid", 0o4755],
    ] as const) {
      writeFileSync(join(t, name), "x\n");
      chmodSync(join(t, name), mode);
    }
    symlinkSync("sub/deep/blob.bin", join(t, "rel-link"));
    symlinkSync("../a.txt", join(t, "sub", "up-link"));
    utimesSync(join(t, "a.txt"), new Date("2001-02-03T04:05:06Z"), new Date("2001-02-03T04:05:06Z"));
    writeFileSync(join(src, "one.txt"), "one\n");
    await sh("ln -s . via && mkdir -p merge/sub && echo old > merge/a.txt && echo keep > merge/mine");
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("pushes a tree to a new place through GNU tar, exactly as the agent's push makes it", async () => {
    const fast = await h.pyro.syncPushWorkspace(id, join(src, "tree"), { dest: "/workspace/new/place" });
    expect(pushVia()).toBe("tar");
    // The same push to a destination reached through a symlink: the agent's.
    const slow = await h.pyro.syncPushWorkspace(id, join(src, "tree"), { dest: "via/agent-place" });
    expect(pushVia()).toBe("agent");
    expect({ ...fast, dest: "" }).toEqual({ ...slow, dest: "" });
    expect(fast).toMatchObject({ dest: "new/place", files: 7, bytes: 6 + 300_000 + 5 + 4 * 2 });
    const made = await listing("new/place");
    expect(made).toBe(await listing("agent-place"));
    expect(made).toContain(`a.txt f 644 root 6 ${Date.UTC(2001, 1, 3, 4, 5, 6) / 1000}.0000000000 \n`);
    expect(made).toContain("setuid f 4755 root 2 ");
    expect(made).toContain("sub/up-link l 777 root 8 ");
    // The directories made on the way are the agent's mkdir's.
    expect(await sh("stat -c '%a %U' new new/place")).toBe("755 root\n755 root");
  });

  it("pushes a file, and into an existing place whose entries fit, through GNU tar", async () => {
    const one = await h.pyro.syncPushWorkspace(id, join(src, "one.txt"), { dest: "merge" });
    expect([pushVia(), one.files, one.dest]).toEqual(["tar", 1, "merge"]);
    mkdirSync(join(src, "m", "sub"), { recursive: true });
    writeFileSync(join(src, "m", "a.txt"), "new\n");
    writeFileSync(join(src, "m", "sub", "b.txt"), "b\n");
    await h.pyro.syncPushWorkspace(id, join(src, "m"), { dest: "/workspace/merge" });
    expect(pushVia()).toBe("tar");
    expect(await sh("cd merge && cat a.txt mine one.txt sub/b.txt")).toBe("new\nkeep\none\nb");
  });

  it("leaves a new destination with a long name to the agent, and leaves no host tar behind", async () => {
    const dest = `long/${"x".repeat(120)}`;
    const r = await h.pyro.syncPushWorkspace(id, join(src, "tree"), { dest });
    expect([pushVia(), r.files]).toEqual(["agent", 7]);
    // Nothing the fast path started is left (its host tar starts only with its peer).
    expect(hostProcesses((argv) => argv.some((a) => a.startsWith(src)))).toEqual([]);
  });

  it("leaves a FIFO out, as the agent's push does, and still goes through GNU tar", async () => {
    mkdirSync(join(src, "withfifo"));
    writeFileSync(join(src, "withfifo", "kept"), "k");
    execFileSync("mkfifo", [join(src, "withfifo", "pipe")]);
    const r = await h.pyro.syncPushWorkspace(id, join(src, "withfifo"), { dest: "withfifo" });
    expect([pushVia(), r.files]).toEqual(["tar", 1]);
    expect(await sh("ls withfifo")).toBe("kept");
  });

  it("leaves a source that leads out, a hard link, a FIFO and a destination that does not fit to the agent", async () => {
    const cases: [string, () => void, string, RegExp][] = [
      ["out", () => symlinkSync("/etc/passwd", join(src, "out", "leak")), "p-out", /leads outside/],
      [
        "hard",
        () => {
          writeFileSync(join(src, "hard", "a"), "a");
          linkSync(join(src, "hard", "a"), join(src, "hard", "b"));
        },
        "p-hard",
        /hard link/,
      ],
    ];
    for (const [name, make, dest, why] of cases) {
      mkdirSync(join(src, name));
      make();
      const before = await sh("ls");
      const got = await refusal(h.pyro.syncPushWorkspace(id, join(src, name), { dest }));
      expect(got, name).toMatchObject({ message: expect.stringMatching(why) });
      expect(await sh("ls"), name).toBe(before);
    }
    // Nothing but a FIFO, which both paths leave out: an archive of no entries, which the
    // agent takes as the destination directory alone (as for an empty directory).
    mkdirSync(join(src, "fifo"));
    execFileSync("mkfifo", [join(src, "fifo", "pipe")]);
    mkdirSync(join(src, "void"));
    for (const name of ["fifo", "void"]) {
      const r = await h.pyro.syncPushWorkspace(id, join(src, name), { dest: `p-${name}` });
      expect([r.files, r.bytes, pushVia()], name).toEqual([0, 0, "agent"]);
      expect(await sh(`ls -A p-${name}; stat -c %F p-${name}`), name).toBe("directory");
    }
    // A symlink in the workspace where the archive has a directory: the agent refuses to
    // extract through it; a file where it has one: the agent's GNU tar replaces it.
    await sh("mkdir -p clash && ln -s /etc clash/sub && mkdir -p clash2 && echo f > clash2/sub");
    mkdirSync(join(src, "clash", "sub"), { recursive: true });
    writeFileSync(join(src, "clash", "sub", "x"), "x");
    const through = await refusal(h.pyro.syncPushWorkspace(id, join(src, "clash"), { dest: "clash" }));
    expect(through).toMatchObject({ code: "conflict", message: expect.stringMatching(/symlink/) });
    const onFile = await refusal(h.pyro.syncPushWorkspace(id, join(src, "clash"), { dest: "clash2" }));
    expect([onFile, pushVia()]).toEqual([null, "agent"]);
    expect(hostProcesses((argv) => argv.some((a) => a.startsWith(src)))).toEqual([]);
    expect(await sh("readlink clash/sub; cat clash2/sub/x")).toBe("/etc\nx");
    // A file where the workspace has a directory (GNU tar cannot replace one with entries):
    // the agent refuses it before writing, as conflict, and nothing changes.
    await sh("mkdir -p clash3/f.txt && echo keep > clash3/f.txt/in && echo old > clash3/other");
    mkdirSync(join(src, "clash3"));
    writeFileSync(join(src, "clash3", "other"), "new");
    writeFileSync(join(src, "clash3", "f.txt"), "file");
    const onDir = await refusal(h.pyro.syncPushWorkspace(id, join(src, "clash3"), { dest: "clash3" }));
    expect(onDir).toMatchObject({
      code: "conflict",
      message: "'f.txt' exists as a directory where the archive has a file",
    });
    expect(await sh("cat clash3/f.txt/in clash3/other")).toBe("keep\nold");
  });

  it("a full disk fails the push as the agent's does, and the workspace stays usable", async () => {
    const small = (await h.create({ diskMib: 64 })).workspace_id;
    mkdirSync(join(src, "big"));
    for (let i = 0; i < 12; i++) writeFileSync(join(src, "big", `f${i}`), Buffer.alloc(8 << 20, i));
    const got = await refusal(h.pyro.syncPushWorkspace(small, join(src, "big"), { dest: "big" }));
    expect(got).toMatchObject({
      code: "internal",
      message: expect.stringMatching(/^tar failed \(exit 2\).*No space/),
    });
    expect(await sh("rm -rf big && echo ok > ok && cat ok", small)).toBe("ok");
  });

  it("GNU tar sent through a symlink (as a swap after the checks would) writes nothing on the host", async () => {
    const state = h.pyro.engine.store().getWorkspace(id)?.runtime.sandbox as {
      pid: number;
      start_time: string;
    };
    const writer = await workspaceWriter(join(h.home, "workspaces", id, "sandbox"), state);
    expect(writer).not.toBeNull();
    const victim = await h.tempDir("push-direct-victim");
    await sh(`ln -s ${victim} host-dir && ln -s /etc etc-link`);
    const archive = () => Readable.from([execFileSync("tar", ["-C", src, "-cf", "-", "one.txt"])]);
    for (const [rel, missing] of [
      ["host-dir", []],
      ["etc-link", []],
      ["host-dir/a/b", ["host-dir/a", "host-dir/a/b"]],
    ] as const) {
      const r = await writer!.unpack(rel, async () => archive(), [...missing]);
      expect([r.started, r.code === 0], rel).toEqual([true, false]);
    }
    expect(existsSync(join(victim, "one.txt"))).toBe(false);
    expect(existsSync(join(victim, "a"))).toBe(false);
    expect(existsSync("/etc/one.txt")).toBe(false);
  });
});
