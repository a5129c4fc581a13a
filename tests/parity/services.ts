import { readFile } from "node:fs/promises";
import { expect } from "vitest";
import {
  listServices,
  serviceLogs,
  serviceStatus,
  startService,
  stopService,
} from "../../src/core/services.js";
import type { PyroError } from "../../src/errors.js";
import { freePort } from "../helpers/net.js";
import { nodeFor } from "./network.js";
import type { Scenario, ScenarioContext } from "./scenarios.js";

/**
 * The service scenarios of the parity suite (issue 14): named long-running commands with
 * readiness probes, through the core (the SDK surface comes later). On host-compat (and
 * the in-process fake) services are host processes: every pid a scenario saw must be
 * gone by its end.
 */

async function code(p: Promise<unknown>): Promise<string> {
  return p.then(
    () => "ok",
    (e: PyroError) => e.code,
  );
}

async function message(p: Promise<unknown>): Promise<string> {
  return p.then(
    () => "",
    (e: PyroError) => e.message,
  );
}

/** Whether a host pid is a live (non-zombie) process. */
async function alive(pid: number): Promise<boolean> {
  const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => null);
  if (!stat) return false;
  const state = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0];
  return state !== "Z" && state !== "X";
}

async function gone(pid: number, ms = 10_000): Promise<boolean> {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    if (!(await alive(pid))) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return !(await alive(pid));
}

/** Service pids are host pids on host-compat and the fake. */
function hostPids(ctx: ScenarioContext): boolean {
  return !ctx.target.real || ctx.target.backend === "host";
}

/** The node binary for a service: the fake's guest runs on the host. */
function node(ctx: ScenarioContext): string {
  return ctx.target.real ? nodeFor(ctx.target.backend) : process.execPath;
}

/**
 * A workspace for `fn`, deleted after; on host-compat every service pid seen must then be
 * gone. The fake's in-process guests do not end their services when they stop (a real
 * sandbox takes them with it), so there they are killed here.
 */
async function withServices(
  ctx: ScenarioContext,
  fn: (id: string, seen: number[]) => Promise<void>,
  extra: Parameters<ScenarioContext["pyro"]["createWorkspace"]>[0] = {},
) {
  const w = await ctx.pyro.createWorkspace({ ...ctx.createOptions, seedPath: ctx.seed, ...extra });
  const seen: number[] = [];
  try {
    await fn(w.workspace_id, seen);
  } finally {
    await ctx.pyro.deleteWorkspace(w.workspace_id).catch(() => {});
  }
  // Where services are host processes (host-compat, the in-process fake), none outlives its workspace.
  if (hostPids(ctx)) for (const pid of seen) expect(await gone(pid), `pid ${pid}`).toBe(true);
}

export const SERVICE_SCENARIOS: Scenario[] = [
  {
    name: "services: every probe kind, a timeout, an exit, logs, list, status and stop",
    run: (ctx) =>
      withServices(ctx, async (id, seen) => {
        const ws = ctx.pyro.engine.workspaces;
        const track = <T extends { pid: number | null }>(s: T): T => {
          if (s.pid !== null) seen.push(s.pid);
          return s;
        };
        const [tcpPort, httpPort] = [await freePort(), await freePort()];
        const file = track(
          await startService(ws, id, "filer", "sleep 0.2; touch ready.flag; exec sleep 600", {
            readiness: { type: "file", path: "ready.flag" },
          }),
        );
        expect(file).toMatchObject({ state: "ready", workspace_id: id });
        const tcp = track(
          await startService(
            ws,
            id,
            "tcp",
            `${node(ctx)} -e 'require("net").createServer(s=>{s.on("error",()=>{});s.end("hi")}).listen(${tcpPort},"127.0.0.1")'`,
            { readiness: { type: "tcp", port: tcpPort } },
          ),
        );
        expect(tcp.state).toBe("ready");
        const web = track(
          await startService(
            ws,
            id,
            "web",
            `${node(ctx)} -e 'require("http").createServer((q,s)=>s.end("ok")).listen(${httpPort},"127.0.0.1")'`,
            { readiness: { type: "http", url: `http://127.0.0.1:${httpPort}/`, timeout_seconds: 60 } },
          ),
        );
        expect(web.state).toBe("ready");
        const cmd = track(
          await startService(ws, id, "cmd", "echo hi > cmd.out; exec sleep 600", {
            readiness: { type: "command", command: "test -s cmd.out" },
          }),
        );
        expect(cmd.state).toBe("ready");
        // A probe that never passes: a timeout naming the last log line; it keeps running.
        const slow = startService(ws, id, "slow", "echo waiting-for-godot; exec sleep 600", {
          readiness: { type: "file", path: "never", timeout_seconds: 1 },
        });
        const [c, m] = await Promise.all([code(slow), message(slow)]);
        expect(c).toBe("timeout");
        expect(m).toContain("waiting-for-godot");
        const slowStatus = track(await serviceStatus(ws, id, "slow"));
        expect(slowStatus.state).toBe("starting");
        // One that exits first: failed, with its code.
        const dies = await startService(ws, id, "dies", "echo bye; exit 4", {
          readiness: { type: "file", path: "never" },
        });
        expect(dies).toMatchObject({ state: "failed", exit_code: 4, pid: null });
        // Logs: the tail, marked truncated when lines were left out.
        const talker = track(
          await startService(
            ws,
            id,
            "talker",
            "for i in 1 2 3 4 5; do echo line$i; done; touch talked; exec sleep 600",
            {
              readiness: { type: "file", path: "talked" },
            },
          ),
        );
        expect(talker.state).toBe("ready");
        const logs = await serviceLogs(ws, id, "talker", 2);
        expect(logs).toMatchObject({
          name: "talker",
          truncated: true,
          lines: [
            { stream: "stdout", text: "line4" },
            { stream: "stdout", text: "line5" },
          ],
        });
        expect((await serviceLogs(ws, id, "talker")).truncated).toBe(false);
        const list = await listServices(ws, id);
        expect(list.services.map((s) => [s.name, s.state]).sort()).toEqual([
          ["cmd", "ready"],
          ["dies", "failed"],
          ["filer", "ready"],
          ["slow", "starting"],
          ["talker", "ready"],
          ["tcp", "ready"],
          ["web", "ready"],
        ]);
        expect([list.count, list.running_count]).toEqual([7, 6]);
        expect(await serviceStatus(ws, id, "tcp")).toMatchObject({
          state: "ready",
          pid: tcp.pid,
          ready: { kind: "tcp", port: tcpPort },
        });
        for (const name of ["filer", "tcp", "web", "cmd", "slow", "talker"]) {
          const stopped = await stopService(ws, id, name, 2);
          expect(stopped, name).toMatchObject({ state: "stopped", pid: null });
        }
        expect((await listServices(ws, id)).running_count).toBe(0);
        if (hostPids(ctx)) for (const pid of seen) expect(await gone(pid), `pid ${pid}`).toBe(true);
      }),
  },
  {
    name: "services: started again (a new process) by stop and start; a reset ends them",
    run: (ctx) =>
      withServices(ctx, async (id, seen) => {
        const ws = ctx.pyro.engine.workspaces;
        const port = await freePort();
        const first = await startService(
          ws,
          id,
          "srv",
          `${node(ctx)} -e 'require("net").createServer(s=>{s.on("error",()=>{});s.end("hi")}).listen(${port},"127.0.0.1")'`,
          { readiness: { type: "tcp", port } },
        );
        seen.push(first.pid!);
        expect(first.state).toBe("ready");
        expect((await ctx.pyro.stopWorkspace(id)).state).toBe("stopped");
        if (hostPids(ctx)) expect(await gone(first.pid!)).toBe(true);
        expect((await ctx.pyro.startWorkspace(id)).state).toBe("running");
        const again = await serviceStatus(ws, id, "srv");
        seen.push(again.pid!);
        expect(again.state).toBe("ready");
        expect(again.pid).not.toBeNull();
        // A new process (a fresh pid namespace may well give it the same number).
        expect(again.started_at > first.started_at).toBe(true);
        if (hostPids(ctx)) expect(again.pid).not.toBe(first.pid);
        expect((await listServices(ws, id)).running_count).toBe(1);
        // A stopped service is not started again.
        await startService(ws, id, "gone", "exec sleep 600").then((s) => seen.push(s.pid!));
        await stopService(ws, id, "gone", 1);
        await ctx.pyro.resetWorkspace(id);
        expect(await listServices(ws, id)).toMatchObject({ count: 0, running_count: 0, services: [] });
        if (hostPids(ctx)) expect(await gone(again.pid!)).toBe(true);
        // A stop and start after the reset brings none back.
        await ctx.pyro.stopWorkspace(id);
        await ctx.pyro.startWorkspace(id);
        expect((await listServices(ws, id)).count).toBe(0);
      }),
  },
  {
    name: "services: the workspace's env and secrets reach them, redacted; bad input changes nothing",
    run: (ctx) =>
      withServices(
        ctx,
        async (id, seen) => {
          const ws = ctx.pyro.engine.workspaces;
          const s = await startService(ws, id, "env", 'echo "$LIT $FWD $OWN"; touch said; exec sleep 600', {
            readiness: { type: "file", path: "said" },
            env: { OWN: "own-value" },
          });
          seen.push(s.pid!);
          expect(s.state).toBe("ready");
          const logs = await serviceLogs(ws, id, "env");
          expect(logs.lines).toEqual([
            { stream: "stdout", text: "[REDACTED:LIT] forwarded-value own-value" },
          ]);
          // A command naming the secret is shown redacted.
          const named = await startService(ws, id, "named", "echo literal-secret; exec sleep 600");
          seen.push(named.pid!);
          expect(named.command).toBe("echo [REDACTED:LIT]; exec sleep 600");
          const before = JSON.stringify(await listServices(ws, id));
          expect(before).not.toContain("literal-secret");
          const unknownWorkspace = await code(ctx.pyro.execWorkspace("ws_000000000000", "true"));
          expect(unknownWorkspace).not.toBe("ok");
          const bad: [() => Promise<unknown>, string][] = [
            [() => startService(ws, "ws_000000000000", "x", "true"), unknownWorkspace],
            [() => serviceStatus(ws, id, "nobody"), "not_found"],
            [() => serviceLogs(ws, id, "nobody"), "not_found"],
            [() => stopService(ws, id, "nobody"), "not_found"],
            [() => startService(ws, id, "env", "exec sleep 600"), "conflict"],
            [
              () => startService(ws, id, "port0", "exec sleep 600", { readiness: { type: "tcp", port: 0 } }),
              "invalid_argument",
            ],
          ];
          for (const [p, want] of bad) expect(await code(p())).toBe(want);
          expect(JSON.stringify(await listServices(ws, id))).toBe(before);
          // The kept definitions are unchanged too: a stop and start brings back exactly these.
          await ctx.pyro.stopWorkspace(id);
          if (hostPids(ctx))
            for (const pid of seen.splice(0)) expect(await gone(pid), `pid ${pid}`).toBe(true);
          await ctx.pyro.startWorkspace(id);
          const after = await listServices(ws, id);
          expect(after.services.map((x) => [x.name, x.state]).sort()).toEqual([
            ["env", "ready"],
            ["named", "ready"],
          ]);
          for (const x of after.services) seen.push(x.pid!);
          for (const x of after.services) await stopService(ws, id, x.name, 1);
        },
        {
          secrets: { LIT: "literal-secret" },
          env: { FWD: "forwarded-value" },
        },
      ),
  },
];
