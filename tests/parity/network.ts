import { spawnSync } from "node:child_process";
import { readFile } from "node:fs/promises";
import { createServer as createHttpServer } from "node:http";
import { createServer, type Server } from "node:net";
import { hostname, networkInterfaces } from "node:os";
import { join } from "node:path";
import { expect } from "vitest";
import type { BackendName } from "../../src/backends/backend.js";
import type { PyroError } from "../../src/errors.js";
import { Pyro } from "../../src/sdk/pyro.js";
import { REPO_ROOT } from "../helpers/cli.js";
import type { Scenario, ScenarioContext } from "./scenarios.js";

/**
 * The network scenarios of the parity suite (docs/network.md). Every server is on this
 * machine: loopback, or the host's own non-loopback address. The workspace reaches
 * loopback servers only through the names the parity targets map for the proxy
 * (`allowed.test`, `blocked.test`: ParityTarget networkTestHosts), never directly.
 */

/** Backends that apply network policies in this build; the others must refuse them. */
const NETWORKED = new Set(["bwrap", "gvisor", "docker", "qemu", "firecracker", "host"]);

export function networked(ctx: ScenarioContext): boolean {
  return ctx.target.real && NETWORKED.has(ctx.target.backend);
}

async function code(p: Promise<unknown>): Promise<string> {
  return p.then(
    () => "ok",
    (e: PyroError) => e.code,
  );
}

/** The node binary as the workspace sees it. */
function nodeIn(ctx: ScenarioContext): string {
  return nodeFor(ctx.target.backend);
}

/** The node binary inside a workspace of `backend` (the injected runtime; the host's own for host-compat). */
export function nodeFor(backend: BackendName): string {
  if (backend === "host") return process.execPath;
  return backend === "qemu" || backend === "firecracker"
    ? "/run/pyro/agent/runtime/bin/node"
    : "/run/pyro/runtime/bin/node";
}

interface Servers {
  http: number;
  /** Paths the host's HTTP server was asked for. */
  seen: string[];
  echo: number;
  /** The host's own non-loopback IPv4 address and an echo server on it, when it has one. */
  own: { address: string; port: number } | null;
  close(): Promise<void>;
}

function listen(server: Server | ReturnType<typeof createHttpServer>, host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, host, () => resolve((server.address() as { port: number }).port));
  });
}

function echoServer(): Server {
  return createServer((s) => {
    s.on("error", () => {});
    s.pipe(s);
  });
}

async function startServers(): Promise<Servers> {
  const seen: string[] = [];
  const http = createHttpServer((req, res) => {
    seen.push(req.url ?? "");
    res.end(`hello from the host ${req.url}`);
  });
  const echo = echoServer();
  const ownAddress = Object.values(networkInterfaces())
    .flat()
    .find((i) => i && i.family === "IPv4" && !i.internal)?.address;
  const ownEcho = ownAddress ? echoServer() : null;
  const ports = {
    http: await listen(http, "127.0.0.1"),
    echo: await listen(echo, "127.0.0.1"),
    own: ownEcho && ownAddress ? { address: ownAddress, port: await listen(ownEcho, ownAddress) } : null,
  };
  return {
    ...ports,
    seen,
    close: async () => {
      for (const s of [http, echo, ownEcho]) s?.close();
    },
  };
}

/** A shell line that waits (at most 20 s) until something listens on 127.0.0.1:PORT in the workspace. */
const WAIT_FOR = (port: string) =>
  `bash -c 'for i in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/${port}) 2>/dev/null && break; sleep 0.1; done'`;

/** Runs netcheck.cjs in the workspace with `checks`; one parsed result per check. */
function netcheck(ctx: ScenarioContext, id: string, ...checks: string[]): Promise<any[]> {
  return runNetcheck(ctx.pyro, id, ctx.target.backend, checks);
}

/** Runs netcheck.cjs in workspace `id` with `checks`: one parsed result per check (the escape suite uses it too). */
export async function runNetcheck(
  pyro: Pyro,
  id: string,
  backend: BackendName,
  checks: string[],
): Promise<any[]> {
  const script = await readFile(join(REPO_ROOT, "tests/parity/netcheck.cjs"), "utf8");
  await pyro.writeWorkspaceFile(id, ".netcheck.cjs", script);
  const r = await pyro.execWorkspace(
    id,
    `${nodeFor(backend)} .netcheck.cjs ${checks.map((c) => `'${c}'`).join(" ")}`,
    {
      timeoutSeconds: 60,
    },
  );
  expect(r.exit_code, r.stderr).toBe(0);
  return r.stdout
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l));
}

export const NETWORK_SCENARIOS: Scenario[] = [
  {
    name: "network: allowlist, SOCKS5 and CONNECT, blocks, approval at once, egress refusals, no direct route",
    run: async (ctx) => {
      const p = ctx.pyro;
      if (!networked(ctx)) {
        // Fail closed: a backend that cannot apply a policy refuses it and makes nothing.
        const before = (await p.listWorkspaces()).count;
        expect(await code(p.createWorkspace({ ...ctx.createOptions, networkPolicy: "egress" }))).toBe(
          "backend_unavailable",
        );
        expect(
          await code(
            p.createWorkspace({ ...ctx.createOptions, publishedPorts: [{ host_port: 0, guest_port: 80 }] }),
          ),
        ).toBe("backend_unavailable");
        expect((await p.listWorkspaces()).count).toBe(before);
        return;
      }
      const srv = await startServers();
      const w = await p.createWorkspace({
        ...ctx.createOptions,
        seedPath: ctx.seed,
        networkPolicy: "allowlist:allowed.test",
        publishedPorts: [{ host_port: 0, guest_port: 18083 }],
      });
      const id = w.workspace_id;
      const ownPublished = w.published_ports[0]!.host_port;
      try {
        expect(w.network_policy).toBe("allowlist:allowed.test");
        const [env, ok, blocked, loop, tunnel, socks, socksBlocked, direct, own, published] = await netcheck(
          ctx,
          id,
          "env",
          `http=allowed.test:${srv.http}`,
          `http=blocked.test:${srv.http}`,
          `http=localhost:${srv.http}`,
          `connect=allowed.test:${srv.echo}`,
          `socks=allowed.test:${srv.echo}`,
          `socks=blocked.test:${srv.echo}`,
          `direct=127.0.0.1:${srv.http}`,
          srv.own ? `direct=${srv.own.address}:${srv.own.port}` : "env",
          `direct=127.0.0.1:${ownPublished}`,
        );
        // Every command gets the proxy, upper and lower case, loopback excluded.
        expect(env.HTTP_PROXY).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
        expect(env.https_proxy).toBe(env.HTTP_PROXY);
        expect(env.ALL_PROXY).toMatch(/^socks5h:\/\/127\.0\.0\.1:\d+$/);
        expect(env.no_proxy).toContain("localhost,127.0.0.1");
        expect(ok).toMatchObject({ status: 200, body: "hello from the host /" });
        expect(blocked.status).toBe(403);
        expect(loop.status).toBe(403);
        expect(tunnel).toMatchObject({ status: 200, echo: "ping\n" });
        expect(socks).toMatchObject({ reply: 0, echo: "ping\n" });
        expect(socksBlocked.reply).toBe(2);
        // Tools use the proxy by themselves, and NO_PROXY keeps the sandbox's own loopback
        // direct: git (in debian:12) fetches from the allowed name through the proxy, and
        // from a server inside the workspace on 127.0.0.1 without it.
        await p.writeWorkspaceFile(
          id,
          ".inner.js",
          `require("http").createServer((q, r) => { require("fs").appendFileSync("inner.log", q.url + "\\n"); r.statusCode = 404; r.end(); }).listen(18081, "127.0.0.1", () => require("fs").writeFileSync("inner.pid", String(process.pid)))`,
        );
        const git = await p.execWorkspace(
          id,
          `setsid -f ${nodeIn(ctx)} .inner.js >/dev/null 2>&1; ${WAIT_FOR("18081")}; ` +
            `git ls-remote http://allowed.test:${srv.http}/via-proxy.git >/dev/null 2>&1; ` +
            `curl -s http://allowed.test:${srv.http}/via-curl >/dev/null; ` +
            "git ls-remote http://127.0.0.1:18081/direct.git >/dev/null 2>&1; cat inner.log; kill $(cat inner.pid)",
        );
        expect(srv.seen.some((u) => u.startsWith("/via-proxy.git/info/refs"))).toBe(true);
        expect(srv.seen).toContain("/via-curl");
        expect(git.stdout).toContain("/direct.git/info/refs");
        if (ctx.target.backend !== "host") {
          // No route but the proxy: the host's loopback and own address are unreachable.
          // (host-compat has no isolation at all: its commands are host processes.)
          expect(direct.connected).toBe(false);
          if (srv.own) expect(own.connected).toBe(false);
          // Nor a published port's host side (this workspace's; any other's is the same loopback).
          expect(published.connected).toBe(false);
        }
        // Each refusal is a capability block, counted.
        const blocks = await p.networkBlocks(id);
        const targets = blocks.blocks.map((b) => b.target);
        expect(targets).toEqual(
          expect.arrayContaining([
            `blocked.test:${srv.http}`,
            `localhost:${srv.http}`,
            `blocked.test:${srv.echo}`,
          ]),
        );
        expect(blocks.blocks.every((b) => b.kind === "network" && b.count >= 1)).toBe(true);
        // A human approves one: it works at once on the running workspace, through the
        // helper its backend serves; the others stay blocked.
        const approved = await p.approveNetwork(id, `blocked.test:${srv.http}`);
        expect(approved.network_policy).toBe(`allowlist:allowed.test,blocked.test:${srv.http}`);
        const [now, still] = await netcheck(
          ctx,
          id,
          `http=blocked.test:${srv.http}`,
          `socks=blocked.test:${srv.echo}`,
        );
        expect(now.status).toBe(200);
        expect(still.reply).toBe(2);
        // egress: public names pass; names that resolve to this machine are refused
        // after resolution (without the test-only map), and counted.
        expect((await p.updateWorkspace(id, { networkPolicy: "egress" })).network_policy).toBe("egress");
        const [loopEgress, selfEgress, testName] = await netcheck(
          ctx,
          id,
          `http=localhost:${srv.http}`,
          `http=${hostname()}:${srv.http}`,
          `http=allowed.test:${srv.http}`,
        );
        expect(loopEgress.status).toBe(403);
        expect(selfEgress.status).not.toBe(200);
        expect(testName.status).toBe(200);
        const reasons = (await p.networkBlocks(id)).blocks.find((b) => b.target === `localhost:${srv.http}`);
        expect(reasons?.reason).toMatch(/loopback/);
        // off: the proxy goes away with the policy; nothing gets out.
        await p.updateWorkspace(id, { networkPolicy: "off" });
        const [off, offEnv] = await netcheck(ctx, id, `http=allowed.test:${srv.http}`, "env");
        expect(off.status ?? 0).not.toBe(200);
        expect(offEnv.HTTP_PROXY).toBeNull();
      } finally {
        await p.deleteWorkspace(id).catch(() => {});
        await srv.close();
      }
    },
  },
  {
    name: "published ports: 127.0.0.1 to a guest server, kept over stop/start, a killed helper and a new client",
    run: async (ctx) => {
      if (!networked(ctx)) return; // refusal proved by the scenario above
      const p = ctx.pyro;
      const before = (await p.listWorkspaces()).count;
      // Bad input changes nothing: the same host port twice, a host port in use.
      expect(
        await code(
          p.createWorkspace({
            ...ctx.createOptions,
            publishedPorts: [
              { host_port: 40999, guest_port: 1 },
              { host_port: 40999, guest_port: 2 },
            ],
          }),
        ),
      ).toBe("invalid_argument");
      const busy = createServer();
      const busyPort = await listen(busy, "127.0.0.1");
      try {
        expect(
          await code(
            p.createWorkspace({
              ...ctx.createOptions,
              publishedPorts: [{ host_port: busyPort, guest_port: 80 }],
            }),
          ),
        ).toBe("conflict");
      } finally {
        busy.close();
      }
      expect((await p.listWorkspaces()).count).toBe(before);

      const w = await p.createWorkspace({
        ...ctx.createOptions,
        seedPath: ctx.seed,
        publishedPorts: [{ host_port: 0, guest_port: 18080 }],
      });
      const id = w.workspace_id;
      const hostPort = w.published_ports[0]!.host_port;
      expect(hostPort).toBeGreaterThan(0);
      // It records its pid: on host-compat a setsid'd server is a host process that would
      // outlive the workspace.
      const server = `require("http").createServer((q, r) => r.end("inside " + q.url)).listen(18080, "127.0.0.1", () => require("fs").writeFileSync("srv.pid", String(process.pid)))`;
      await p.writeWorkspaceFile(id, ".srv.js", server);
      // setsid: a plain `&` job ends with its exec (the session is hung up).
      const serve = () =>
        p.execWorkspace(id, `setsid -f ${nodeIn(ctx)} .srv.js >/dev/null 2>&1; ${WAIT_FOR("18080")}`);
      const get = () =>
        fetch(`http://127.0.0.1:${hostPort}/x`).then(
          (r) => r.text(),
          () => "refused",
        );
      try {
        await serve();
        expect(await get()).toBe("inside /x");
        // Bound on loopback only.
        expect(spawnSync("ss", ["-Hltn", `sport = :${hostPort}`], { encoding: "utf8" }).stdout).toContain(
          `127.0.0.1:${hostPort}`,
        );
        await p.stopWorkspace(id);
        expect(await get()).toBe("refused");
        const started = await p.startWorkspace(id);
        expect(started.published_ports).toEqual([{ host_port: hostPort, guest_port: 18080 }]);
        await serve();
        expect(await get()).toBe("inside /x");
        // The helper killed (a reboot, an OOM): the next operation starts it again.
        const ready = JSON.parse(
          await readFile(join(ctx.home, "workspaces", id, "net", "netd.ready.json"), "utf8"),
        ) as { pid: number };
        process.kill(ready.pid, "SIGKILL");
        await new Promise((r) => setTimeout(r, 200));
        expect(await get()).toBe("refused");
        // A new client (another CLI call, a restarted server) finds the port as bound and,
        // with its first operation, starts the helper again.
        const next = ctx.target.real ? new Pyro({ env: { ...process.env, ...ctx.cliEnv } }) : p;
        try {
          expect((await next.getWorkspace(id)).published_ports[0]!.host_port).toBe(hostPort);
        } finally {
          if (next !== p) await next.close();
        }
        expect(await get()).toBe("inside /x");
      } finally {
        await p.execWorkspace(id, "kill $(cat srv.pid)").catch(() => {});
        await p.deleteWorkspace(id).catch(() => {});
      }
      expect(await get()).toBe("refused");
    },
  },
];
