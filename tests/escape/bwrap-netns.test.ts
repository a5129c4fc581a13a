import { readdirSync, readFileSync, readlinkSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Pyro } from "../../src/sdk/pyro.js";
import { ENV_CACHE, envCacheSkipReason, onPath } from "../helpers/sandbox.js";

/**
 * The bwrap network helper listens on 127.0.0.1:3128 inside the sandbox's network
 * namespace (docs/network.md, "The helper listens in the sandbox"). What crosses the
 * boundary is one listening socket owned by a host process: these prove it is in the
 * sandbox's namespace only (never on the host's loopback), that it follows a restarted
 * sandbox into its new namespace and closes the old one's, and that it goes with the
 * policy.
 */
const skip =
  process.getuid?.() !== 0
    ? "needs root (bwrap)"
    : !onPath("bwrap")
      ? "bubblewrap is not installed"
      : envCacheSkipReason();

/** A request the proxy refuses (the host's loopback): 403 shows the proxy answered. */
const CURL_403 = "curl -s -o /dev/null -w '%{http_code}' --noproxy '' -x $HTTP_PROXY http://127.0.0.1:9/";

/** Socket inodes the process `pid` holds. */
function socketsOf(pid: number): Set<string> {
  const out = new Set<string>();
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (m) out.add(m[1]!);
    } catch {}
  }
  return out;
}

/** Listening TCP sockets in a /proc/net/tcp text: their port and inode. */
function listeners(text: string): { port: number; inode: string }[] {
  return text
    .split("\n")
    .slice(1)
    .map((l) => l.trim().split(/\s+/))
    .filter((f) => f[3] === "0A")
    .map((f) => ({ port: Number.parseInt(f[1]!.split(":")[1]!, 16), inode: f[9]! }));
}

describe.skipIf(skip !== "")(
  `bwrap: the helper's listener in the sandbox${skip ? ` (skipped: ${skip})` : ""}`,
  () => {
    let home: string;
    let pyro: Pyro;
    beforeAll(async () => {
      home = await mkdtemp(join(tmpdir(), "pyro-netns-"));
      pyro = new Pyro({ home, environmentsDir: ENV_CACHE });
    });
    afterAll(async () => {
      for (const w of (await pyro.listWorkspaces()).workspaces) await pyro.deleteWorkspace(w.workspace_id);
      await pyro.close();
      await rm(home, { recursive: true, force: true });
    });

    const helperPid = (id: string): number =>
      (
        JSON.parse(readFileSync(join(home, "workspaces", id, "net", "netd.ready.json"), "utf8")) as {
          pid: number;
        }
      ).pid;
    const insideListeners = async (id: string) =>
      listeners((await pyro.execWorkspace(id, "cat /proc/net/tcp")).stdout);
    const agentPid = (id: string): number =>
      (pyro.engine.workspaces.store.getWorkspace(id)!.runtime.sandbox as { agent_pid: number }).agent_pid;

    it("is on 3128 in the sandbox only, follows a restarted sandbox and closes the old one", {
      timeout: 120_000,
    }, async () => {
      const w = await pyro.createWorkspace({ backend: "bwrap", networkPolicy: "egress" });
      const id = w.workspace_id;
      const helper = helperPid(id);
      const first = (await insideListeners(id)).filter((l) => l.port === 3128);
      expect(first).toHaveLength(1);
      expect(socketsOf(helper).has(first[0]!.inode)).toBe(true);
      // The host's loopback has none of the helper's sockets listening (bwrap: no TCP proxy port).
      const hostSide = listeners(readFileSync("/proc/net/tcp", "utf8")).filter((l) =>
        socketsOf(helper).has(l.inode),
      );
      expect(hostSide).toEqual([]);

      // The sandbox dies with its agent (as in an OOM kill); the next use restarts it in a new namespace.
      process.kill(agentPid(id), "SIGKILL");
      await new Promise((r) => setTimeout(r, 300));
      const second = (await insideListeners(id)).filter((l) => l.port === 3128);
      expect(second).toHaveLength(1);
      expect(second[0]!.inode).not.toBe(first[0]!.inode);
      const held = socketsOf(helperPid(id));
      expect(held.has(second[0]!.inode)).toBe(true);
      expect(held.has(first[0]!.inode)).toBe(false);
      const r = await pyro.execWorkspace(
        id,
        "curl -s -o /dev/null -w '%{http_code}' --noproxy '' -x $HTTP_PROXY http://127.0.0.1:9/",
      );
      expect(r.stdout).toBe("403");
    });

    it("goes with the policy: off leaves nothing on 3128, egress attaches again in the running sandbox", async () => {
      const w = await pyro.createWorkspace({ backend: "bwrap", networkPolicy: "egress" });
      const id = w.workspace_id;
      expect((await insideListeners(id)).some((l) => l.port === 3128)).toBe(true);
      await pyro.updateWorkspace(id, { networkPolicy: "off" });
      expect((await insideListeners(id)).some((l) => l.port === 3128)).toBe(false);
      await pyro.updateWorkspace(id, { networkPolicy: "egress" });
      const back = (await insideListeners(id)).filter((l) => l.port === 3128);
      expect(back).toHaveLength(1);
      expect(socketsOf(helperPid(id)).has(back[0]!.inode)).toBe(true);
    });

    it("a process of the workspace holding 3128 makes turning egress on fail, with the way out", async () => {
      const w = await pyro.createWorkspace({ backend: "bwrap" });
      const id = w.workspace_id;
      await pyro.execWorkspace(
        id,
        `nohup python3 -c 'import socket,time; s=socket.socket(); s.bind(("127.0.0.1",3128)); s.listen(); time.sleep(600)' >/dev/null 2>&1 & echo $! > squat.pid; sleep 0.5`,
      );
      const err = await pyro.updateWorkspace(id, { networkPolicy: "egress", name: "renamed" }).then(
        () => null,
        (e: { code: string; message: string; hint?: string }) => e,
      );
      expect(err).toMatchObject({
        code: "backend_unavailable",
        message: expect.stringContaining("EADDRINUSE"),
      });
      expect(err?.hint).toContain("holds port 3128");
      // Nothing changed: the policy is the one it had, and the workspace works.
      const now = await pyro.getWorkspace(id);
      expect(now.network_policy).toBe("off");
      expect(now.name).not.toBe("renamed");
      await pyro.execWorkspace(id, "kill $(cat squat.pid)");
      await pyro.updateWorkspace(id, { networkPolicy: "egress" });
      const r = await pyro.execWorkspace(id, CURL_403);
      expect(r.stdout).toBe("403");
    });

    it("a live helper without its control socket (an older build's) is replaced at the next sandbox start", async () => {
      const w = await pyro.createWorkspace({ backend: "bwrap", networkPolicy: "egress" });
      const id = w.workspace_id;
      const old = helperPid(id);
      await rm(join(home, "workspaces", id, "net", "netd.ctl.sock"));
      process.kill(agentPid(id), "SIGKILL");
      await new Promise((r) => setTimeout(r, 300));
      const r = await pyro.execWorkspace(id, CURL_403);
      expect(r.stdout).toBe("403");
      expect(helperPid(id)).not.toBe(old);
      expect((await pyro.getWorkspace(id)).state).toBe("running");
    });

    it("finds the sandbox's namespace without a recorded agent (a sandbox that cannot reset in place)", async () => {
      const w = await pyro.createWorkspace({ backend: "bwrap", networkPolicy: "egress" });
      const state = pyro.engine.workspaces.store.getWorkspace(w.workspace_id)!.runtime.sandbox as Record<
        string,
        unknown
      >;
      const { agent_pid, agent_start_time: _, ...bare } = state;
      const backend = pyro.engine.backend("bwrap");
      const found = await backend.egressNamespace!(bare as never);
      expect(found).not.toBeNull();
      expect(readlinkSync(`/proc/${found!.pid}/ns/net`)).toBe(readlinkSync(`/proc/${agent_pid}/ns/net`));
      expect(readlinkSync(`/proc/${found!.pid}/ns/net`)).not.toBe(readlinkSync("/proc/self/ns/net"));
      // A launcher that is not the recorded one (a reused pid) finds nothing.
      expect(await backend.egressNamespace!({ ...bare, start_time: "1" } as never)).toBeNull();
    });

    it("two clients that both find the helper dead start one helper between them", async () => {
      const w = await pyro.createWorkspace({ backend: "bwrap", networkPolicy: "egress" });
      const id = w.workspace_id;
      const others = [0, 1].map(() => new Pyro({ home, environmentsDir: ENV_CACHE }));
      try {
        for (let round = 0; round < 3; round++) {
          process.kill(helperPid(id), "SIGKILL");
          await new Promise((r) => setTimeout(r, 100));
          const results = await Promise.all(others.map((p) => p.execWorkspace(id, CURL_403)));
          expect(results.map((r) => r.stdout)).toEqual(["403", "403"]);
          const helpers = readdirSync("/proc").filter((p) => {
            try {
              return (
                /^\d+$/.test(p) &&
                (() => {
                  const cmd = readFileSync(`/proc/${p}/cmdline`, "utf8");
                  return cmd.includes("netd.js") && cmd.includes(join(home, "workspaces", id));
                })()
              );
            } catch {
              return false;
            }
          });
          expect(helpers).toEqual([String(helperPid(id))]);
        }
      } finally {
        for (const p of others) await p.close();
      }
    });
  },
);
