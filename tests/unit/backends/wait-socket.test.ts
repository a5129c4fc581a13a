import { mkdtemp, rm } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { waitForSocket } from "../../../src/backends/common.js";

/** Open fs.watch handles of this process. */
const watchers = () => process.getActiveResourcesInfo().filter((r) => r === "FSEventWrap").length;

/** Whether the count of open watchers comes back to `n` (a closed one goes a few turns later). */
async function watchersBackTo(n: number): Promise<boolean> {
  for (let i = 0; i < 100; i++) {
    if (watchers() === n) return true;
    await new Promise((r) => setTimeout(r, 10));
  }
  return false;
}

describe("waitForSocket", () => {
  const dirs: string[] = [];
  const servers: net.Server[] = [];
  afterAll(async () => {
    for (const s of servers) s.close();
    for (const d of dirs) await rm(d, { recursive: true, force: true });
  });
  const temp = async () => {
    const d = await mkdtemp(join(tmpdir(), "pyro-wait-"));
    dirs.push(d);
    return d;
  };

  it("returns once the socket accepts, and leaves no watcher behind", async () => {
    const dir = await temp();
    const path = join(dir, "agent.sock");
    const before = watchers();
    let tries = 0;
    const waiting = waitForSocket(
      path,
      async () => {
        tries++;
        // The agent binds after a few tries.
        if (tries === 3) servers.push(net.createServer().listen(path));
        return true;
      },
      { timeoutMs: 10_000, what: "test sandbox" },
    );
    await expect(waiting).resolves.toBeUndefined();
    expect(tries).toBeGreaterThanOrEqual(3);
    expect(await watchersBackTo(before)).toBe(true);
  });

  it("fails with the log's tail when the sandbox dies first, and when nothing answers in time", async () => {
    const dir = await temp();
    const path = join(dir, "agent.sock");
    const before = watchers();
    await expect(
      waitForSocket(path, async () => false, { timeoutMs: 10_000, what: "test sandbox" }),
    ).rejects.toMatchObject({
      code: "backend_unavailable",
      message: expect.stringContaining("exited during start"),
    });
    await expect(
      waitForSocket(path, async () => true, { timeoutMs: 50, what: "test sandbox" }),
    ).rejects.toMatchObject({ code: "timeout" });
    expect(await watchersBackTo(before)).toBe(true);
  });

  it("still polls where the directory cannot be watched (it does not exist yet)", async () => {
    const dir = await temp();
    const path = join(dir, "later", "agent.sock");
    let tries = 0;
    await expect(
      waitForSocket(
        path,
        async () => {
          if (++tries === 2) {
            const { mkdirSync } = await import("node:fs");
            mkdirSync(join(dir, "later"));
            servers.push(net.createServer().listen(path));
          }
          return true;
        },
        { timeoutMs: 10_000, what: "test sandbox" },
      ),
    ).resolves.toBeUndefined();
  });
});
