import { spawnSync } from "node:child_process";
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CREATOR_FILE, makeWorkspaceDir, recoverInterrupted } from "../../../src/core/recovery.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-recovery-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const host = (workspacesDir: string) => ({
  rows: () => [],
  row: () => null,
  workspacesDir,
  destroy: async () => {},
});

describe("workspace directories and recovery", () => {
  it("makes a workspace directory that never exists without its creator record", async () => {
    const ws = join(dir, "ws_0123456789ab");
    await makeWorkspaceDir(ws);
    expect((await readdir(ws)).sort()).toEqual([CREATOR_FILE, "sandbox"]);
    expect((await stat(ws)).mode & 0o777).toBe(0o700);
    expect(JSON.parse(await readFile(join(ws, CREATOR_FILE), "utf8"))).toMatchObject({ pid: process.pid });
    expect(await readdir(dir)).toEqual(["ws_0123456789ab"]);
  });

  it("collects a create killed while staging (its creator gone) and keeps one still in progress", async () => {
    // A creator that has exited: a short-lived child's pid and start time.
    const child = spawnSync("sh", ["-c", "echo $$; cut -d' ' -f22 /proc/$$/stat"], { encoding: "utf8" });
    const [pid, startTime] = child.stdout.trim().split("\n");
    const dead = join(dir, ".creating-ws_aaaaaaaaaaaa");
    await mkdir(join(dead, "sandbox"), { recursive: true });
    await writeFile(join(dead, CREATOR_FILE), JSON.stringify({ pid: Number(pid), start_time: startTime }));
    const alive = join(dir, ".creating-ws_bbbbbbbbbbbb");
    await makeWorkspaceDir(join(dir, "ws_cccccccccccc"));
    await mkdir(join(alive, "sandbox"), { recursive: true });
    const own = await readFile(join(dir, "ws_cccccccccccc", CREATOR_FILE), "utf8");
    await writeFile(join(alive, CREATOR_FILE), own);
    // ws_cccccccccccc's creator (this process) is alive: it is kept too, like a create in progress.
    const done = await recoverInterrupted(host(dir));
    expect(done).toEqual(["ws_aaaaaaaaaaaa"]);
    expect((await readdir(dir)).sort()).toEqual([".creating-ws_bbbbbbbbbbbb", "ws_cccccccccccc"]);
  });
});
