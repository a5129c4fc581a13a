import { mkdtemp, readFile, rm } from "node:fs/promises";
import os, { tmpdir } from "node:os";
import { join } from "node:path";
import type { Readable } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { exitOfStatus, Spawner } from "../../../src/agent/guest/spawner.js";
import { statFields } from "../../../src/backends/common.js";
import { prepareSpawnHelper } from "../../../src/backends/spawn-helper.js";

/**
 * The agent's command starter (agent/guest/spawner.ts with the C helper of
 * backends/spawn-helper.ts), built here with the host's cc, against what Node's spawn
 * gives exec: output on two pipes, the exit code or signal, a new session, exactly the
 * environment and cwd asked for, default signal dispositions, many at once.
 */
/** What a stream still has to give (a socket that already ended has given it all). */
const read = (s: Readable) =>
  new Promise<string>((resolve) => {
    let out = "";
    if (s.destroyed) return resolve(out);
    s.setEncoding("utf8");
    s.on("data", (d: string) => {
      out += d;
    });
    s.on("close", () => resolve(out));
  });

let dir: string;
let helper: string | null;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-spawner-"));
  helper = await prepareSpawnHelper(dir);
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("the agent's command starter", () => {
  it("maps raw wait statuses as Node reports exits", () => {
    expect(exitOfStatus(0)).toEqual({ code: 0, sig: null });
    expect(exitOfStatus(3 << 8)).toEqual({ code: 3, sig: null });
    expect(exitOfStatus(9)).toEqual({ code: null, sig: "SIGKILL" });
    expect(exitOfStatus(15 | 0x80)).toEqual({ code: null, sig: "SIGTERM" });
  });

  it("is not used without its binary (the agent spawns itself then)", async () => {
    expect(await new Spawner(join(dir, "missing")).usable()).toBe(false);
  });

  it("runs /bin/sh -c as a session leader with exactly its env and cwd, and reports its exit", async (ctx) => {
    if (!helper) return ctx.skip(); // no C compiler here: the agent spawns commands itself
    const s = new Spawner(helper);
    let lowered = 0;
    expect(await s.usable({ nice: 17, oom: () => lowered++ })).toBe(true);
    expect(lowered).toBe(1);
    // Commands at the nice value asked for, from their first instruction (the shell's own
    // nice, not a child's); the helper, which reaps their orphans, at the agent's.
    const helperPid = (s as unknown as { helper: { pid: number } }).helper.pid;
    const niced = await s.start('cut -d" " -f19 /proc/$$/stat', "/", { PATH: "/usr/bin:/bin" });
    expect((await Promise.all([read(niced.stdout), niced.exited]))[0]).toBe("17\n");
    const helperStat = await readFile(`/proc/${helperPid}/stat`, "utf8");
    expect(Number(statFields(helperStat)[16])).toBe(os.getPriority());
    const c = await s.start(
      'echo "$FOO $(pwd)"; cut -d" " -f6 /proc/$$/stat; echo $$; env | sort | tr "\\n" ,; echo err >&2; exit 7',
      "/tmp",
      { FOO: "bar baz", PATH: "/usr/bin:/bin" },
    );
    const [out, err, exit] = await Promise.all([read(c.stdout), read(c.stderr), c.exited]);
    const [first, sid, pid, env] = out.split("\n");
    expect(first).toBe("bar baz /tmp");
    expect(sid).toBe(pid);
    expect(Number(pid)).toBe(c.pid);
    expect(env).toBe("FOO=bar baz,PATH=/usr/bin:/bin,PWD=/tmp,");
    expect(err).toBe("err\n");
    expect(exit).toEqual({ code: 7, sig: null });
  });

  it("reports a command ended by a signal, a cwd that does not exist, and many commands at once", async (ctx) => {
    if (!helper) return ctx.skip();
    const s = new Spawner(helper);
    expect(await s.usable()).toBe(true);
    // No signal ignored or blocked, though the helper ignores SIGPIPE and blocks SIGCHLD.
    // (The shell's exec'd grep reads its own: the shell blocks everything around a fork.)
    const sigs = await s.start("exec grep -E '^Sig(Blk|Ign):' /proc/self/status", "/", {
      PATH: "/usr/bin:/bin",
    });
    expect((await Promise.all([read(sigs.stdout), sigs.exited]))[0]).toMatch(
      /^SigBlk:\s+0+\nSigIgn:\s+0+\n$/,
    );
    const killed = await s.start("kill -TERM $$", "/", {});
    expect(await killed.exited).toEqual({ code: null, sig: "SIGTERM" });
    await expect(s.start("true", join(dir, "nope"), {})).rejects.toThrow(/errno/);
    // Each read from the moment it starts, as exec does (an empty stream may end at once).
    const outs = await Promise.all(
      Array.from({ length: 30 }, async (_, i) => {
        const c = await s.start(`head -c ${i * 10000} /dev/zero | tr '\\0' x`, "/", {
          PATH: "/usr/bin:/bin",
        });
        return (await Promise.all([read(c.stdout), c.exited]))[0];
      }),
    );
    expect(outs.map((o) => o.length)).toEqual(Array.from({ length: 30 }, (_, i) => i * 10000));
  });

  it("holds its commands' orphans (subreaper), so it knows when a command left nothing behind", async (ctx) => {
    if (!helper) return ctx.skip();
    const s = new Spawner(helper);
    expect(await s.usable()).toBe(true);
    const helperPid = (s as unknown as { helper: { pid: number } }).helper.pid;
    const run = async (command: string) => {
      const c = await s.start(command, "/", { PATH: "/usr/bin:/bin" });
      c.stdout.resume();
      c.stderr.resume();
      return c;
    };
    await (await run("true")).exited;
    expect(s.mayHaveLeftovers()).toBe(false);
    // A command still running is not a leftover of another one.
    const running = await run("exec sleep 30");
    await (await run("true")).exited;
    expect(s.mayHaveLeftovers()).toBe(false);
    // A double fork: the subshell exits at once and its sleep is orphaned. Without the
    // subreaper it would go to init, out of the helper's sight, and be missed.
    await (await run("(sleep 30 >/dev/null 2>&1 &); true")).exited;
    expect(s.mayHaveLeftovers()).toBe(true);
    const children = (await readFile(`/proc/${helperPid}/task/${helperPid}/children`, "utf8"))
      .trim()
      .split(" ");
    const orphan = Number(children.find((p) => Number(p) !== running.pid));
    // Forked by the subshell before it exited, but on a busy machine maybe not yet past
    // its exec of sleep (its name is still "sh" until then).
    await expect
      .poll(async () => (await readFile(`/proc/${orphan}/comm`, "utf8")).trim(), { timeout: 10_000 })
      .toBe("sleep");
    process.kill(orphan, "SIGKILL");
    process.kill(running.pid!, "SIGKILL");
    await running.exited;
    // Reaped by the helper: nothing left again.
    await expect.poll(() => s.mayHaveLeftovers(), { timeout: 10_000 }).toBe(false);
  });

  it("fails what is in flight when the helper dies, and is not used after", async (ctx) => {
    if (!helper) return ctx.skip();
    const s = new Spawner(helper);
    expect(await s.usable()).toBe(true);
    const c = await s.start("sleep 30", "/", {});
    (s as unknown as { helper: { kill(sig: string): void } }).helper.kill("SIGKILL");
    await expect(c.exited).rejects.toThrow(/command starter/);
    expect(await s.usable()).toBe(false);
    process.kill(-c.pid!, "SIGKILL");
  });
});
