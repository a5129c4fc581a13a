import { readFile } from "node:fs/promises";
import net from "node:net";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { AgentError } from "../../../src/agent/errors.js";
import {
  killAllServices,
  SERVICE_LINE_BYTES,
  SERVICE_LOG_LINES,
} from "../../../src/agent/guest/ops/services.js";
import { freePort } from "../../helpers/net.js";
import { type AgentFixture, alive, eventually, startAgent } from "./helpers.js";

let fx: AgentFixture;
/** Process groups started by a test, killed afterwards whatever happened. */
let groups: number[] = [];

beforeEach(async () => {
  fx = await startAgent();
  groups = [];
});
afterEach(async () => {
  for (const pid of groups) {
    try {
      process.kill(-pid, "SIGKILL");
    } catch {}
  }
  await fx.cleanup();
});

type StartArgs = {
  ready?:
    | { kind: "file"; path: string }
    | { kind: "tcp"; port: number }
    | { kind: "http"; url: string }
    | {
        kind: "command";
        command: string;
      }
    | null;
  ready_timeout_ms?: number;
  cwd?: string;
  env?: Record<string, string>;
};

async function start(name: string, command: string, extra: StartArgs = {}) {
  const r = await fx.client.request("service_start", { name, command, ...extra });
  if (r.service.pid !== null) groups.push(r.service.pid);
  return r;
}

const stop = (name: string, grace_ms = 2000) => fx.client.request("service_stop", { name, grace_ms });

async function codeOf(p: Promise<unknown>): Promise<string> {
  return p.then(
    () => "ok",
    (e: AgentError) => e.code,
  );
}

const NODE = JSON.stringify(process.execPath);

describe("services", () => {
  it("a file probe, relative to the cwd, passes once the service makes it", async () => {
    const r = await start("filer", "mkdir -p sub; sleep 0.3; touch sub/ready; exec sleep 100", {
      ready: { kind: "file", path: "sub/ready" },
    });
    expect(r).toMatchObject({ timed_out: false, log_tail: [], service: { name: "filer", state: "ready" } });
    expect(r.service.ready_at).not.toBeNull();
    expect(await readFile(path.join(fx.root, "sub/ready"), "utf8")).toBe("");
    expect((await stop("filer")).service.state).toBe("stopped");
  });

  it("a tcp probe passes once the service listens on the loopback port", async () => {
    const port = await freePort();
    const r = await start(
      "tcp",
      `${NODE} -e 'setTimeout(()=>require("net").createServer(s=>s.end()).listen(${port},"127.0.0.1"),300)'`,
      { ready: { kind: "tcp", port } },
    );
    expect(r.service.state).toBe("ready");
    const conn = await new Promise<boolean>((resolve) => {
      const s = net.connect({ host: "127.0.0.1", port }, () => {
        s.destroy();
        resolve(true);
      });
      s.on("error", () => resolve(false));
    });
    expect(conn).toBe(true);
    await stop("tcp");
  });

  it("an http probe passes once the URL answers below 500", async () => {
    const port = await freePort();
    const r = await start(
      "web",
      `${NODE} -e 'let n=0; require("http").createServer((q,s)=>{s.statusCode=++n<3?503:200;s.end("ok")}).listen(${port},"127.0.0.1")'`,
      { ready: { kind: "http", url: `http://127.0.0.1:${port}/health` } },
    );
    expect(r.service.state).toBe("ready");
    await stop("web");
  });

  it("a command probe passes once it exits 0, with the service's env and cwd", async () => {
    const r = await start("cmd", "sleep 0.3; echo up > state; exec sleep 100", {
      ready: { kind: "command", command: 'grep -q "$WANT" state' },
      env: { WANT: "up" },
    });
    expect(r.service.state).toBe("ready");
    await stop("cmd");
  });

  it("a service without a probe is ready at once", async () => {
    const r = await start("plain", "exec sleep 100");
    expect(r.service).toMatchObject({ state: "ready", exit_code: null, ready: null });
    expect(r.service.pid).toBeGreaterThan(0);
    expect(await alive(r.service.pid!)).toBe(true);
    const list = await fx.client.request("service_list", {});
    expect(list.services.map((s) => [s.name, s.state])).toEqual([["plain", "ready"]]);
    await stop("plain");
  });

  it("an exit before ready is failed, with its exit code and the log's last lines", async () => {
    const r = await start("dies", "echo boom >&2; exit 3", {
      ready: { kind: "file", path: "never" },
      ready_timeout_ms: 10_000,
    });
    expect(r.service).toMatchObject({ state: "failed", exit_code: 3, pid: null });
    expect(r.timed_out).toBe(false);
    expect(r.log_tail).toEqual(["boom"]);
    // A failed service may be started again under its name.
    const again = await start("dies", "exec sleep 100");
    expect(again.service.state).toBe("ready");
    await stop("dies");
  });

  it("a probe that never passes times out; the service keeps starting, and stops", async () => {
    const r = await start("slow", "echo first; echo last-line; exec sleep 100", {
      ready: { kind: "file", path: "never" },
      ready_timeout_ms: 500,
    });
    expect(r.timed_out).toBe(true);
    expect(r.service.state).toBe("starting");
    expect(r.log_tail).toEqual(["first", "last-line"]);
    const pid = r.service.pid!;
    expect(await alive(pid)).toBe(true);
    expect((await fx.client.request("service_status", { name: "slow" })).service.state).toBe("starting");
    const s = await stop("slow");
    expect(s).toMatchObject({ killed: false, service: { state: "stopped", pid: null } });
    expect(await eventually(async () => !(await alive(pid)))).toBe(true);
  });

  it("a running name is a conflict; an unknown name is not_found", async () => {
    await start("dup", "exec sleep 100");
    expect(await codeOf(start("dup", "exec sleep 100"))).toBe("conflict");
    expect((await fx.client.request("service_list", {})).services).toHaveLength(1);
    for (const op of ["service_status", "service_logs", "service_stop"] as const)
      expect(await codeOf(fx.client.request(op, { name: "nobody" }))).toBe("not_found");
    await stop("dup");
  });

  it("the log ring keeps the last lines, cuts long lines, and shows a partial last line", async () => {
    const total = SERVICE_LOG_LINES + 500;
    const r = await start(
      "chatty",
      `seq 1 ${total}; head -c 10000 /dev/zero | tr '\\0' x; echo; sleep 0.3; echo err >&2; printf partial; exec sleep 100`,
      { ready: { kind: "command", command: "true" } },
    );
    expect(r.service.state).toBe("ready");
    const logs = async (tail: number) =>
      fx.client.request("service_logs", { name: "chatty", tail_lines: tail });
    expect(await eventually(async () => (await logs(1)).lines.some((l) => l.text === "partial"), 5000)).toBe(
      true,
    );
    const all = await logs(10_000);
    expect(all.truncated).toBe(true);
    // 2000 complete lines kept, plus the unfinished one.
    expect(all.lines).toHaveLength(SERVICE_LOG_LINES + 1);
    const stdout = all.lines.filter((l) => l.stream === "stdout").map((l) => l.text);
    expect(stdout.at(-1)).toBe("partial");
    const long = stdout.at(-2)!;
    expect(long).toBe("x".repeat(SERVICE_LINE_BYTES));
    expect(stdout.at(-3)).toBe(String(total));
    expect(stdout[0]).toBe(String(total - SERVICE_LOG_LINES + 3));
    expect(all.lines.filter((l) => l.stream === "stderr")).toEqual([{ stream: "stderr", text: "err" }]);
    const last = await logs(2);
    expect(last.lines.map((l) => l.text)).toEqual(["err", "partial"]);
    expect(last.truncated).toBe(true);
    await stop("chatty");
  });

  it("stop sends TERM, then KILL after the grace period, to the whole process group", async () => {
    const r = await start(
      "stubborn",
      "trap '' TERM; (trap '' TERM; sleep 100) & echo $! > grandchild; sleep 100; wait",
      {
        ready: { kind: "file", path: "grandchild" },
      },
    );
    expect(r.service.state).toBe("ready");
    const grandchild = Number((await readFile(path.join(fx.root, "grandchild"), "utf8")).trim());
    expect(grandchild).toBeGreaterThan(0);
    expect(await alive(grandchild)).toBe(true);
    const started = Date.now();
    const s = await stop("stubborn", 500);
    expect(Date.now() - started).toBeGreaterThanOrEqual(450);
    expect(s).toMatchObject({ killed: true, service: { state: "stopped", pid: null } });
    expect(await eventually(async () => !(await alive(grandchild)))).toBe(true);
    expect(await eventually(async () => !(await alive(r.service.pid!)))).toBe(true);
    // Stopping a stopped service is a no-op.
    expect(await stop("stubborn")).toMatchObject({ killed: false, service: { state: "stopped" } });
  });

  it("killAllServices ends every running service's process group", async () => {
    const a = await start("a", "sleep 100 & exec sleep 100");
    const b = await start("b", "exec sleep 100", { ready: { kind: "command", command: "true" } });
    killAllServices();
    for (const pid of [a.service.pid!, b.service.pid!])
      expect(await eventually(async () => !(await alive(pid)))).toBe(true);
    const list = await fx.client.request("service_list", {});
    expect(list.services.map((s) => s.state)).toEqual(["stopped", "stopped"]);
  });

  it("each workspace served in one process has its own services", async () => {
    const other = await startAgent();
    try {
      await start("mine", "exec sleep 100");
      expect((await other.client.request("service_list", {})).services).toEqual([]);
      expect(await codeOf(other.client.request("service_status", { name: "mine" }))).toBe("not_found");
      const theirs = await other.client.request("service_start", { name: "mine", command: "exec sleep 100" });
      groups.push(theirs.service.pid!);
      expect(theirs.service.state).toBe("ready");
      await other.client.request("service_stop", { name: "mine", grace_ms: 1000 });
      await stop("mine");
    } finally {
      await other.cleanup();
    }
  });
});
