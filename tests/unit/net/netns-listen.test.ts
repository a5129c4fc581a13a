import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { procStartTime } from "../../../src/backends/common.js";
import { SandboxListener } from "../../../src/core/netd-attach.js";
import { listenInNamespace, type NamespaceHolder, namespaceId } from "../../../src/net/netns-listen.js";

const isRoot = process.getuid?.() === 0;
const hasUnshare = spawnSync("unshare", ["--version"]).status === 0;
const can = isRoot && hasUnshare;

/** A process alone in a new network namespace (loopback up), as a sandbox's agent is. */
async function namespaceHolder(): Promise<{ child: ChildProcess; holder: NamespaceHolder }> {
  const child = spawn(
    "unshare",
    ["--net", "sh", "-c", "ip link set lo up 2>/dev/null; echo up; exec sleep 120"],
    {
      stdio: ["ignore", "pipe", "inherit"],
    },
  );
  await new Promise<void>((resolve) => child.stdout?.once("data", () => resolve()));
  const pid = child.pid as number;
  return { child, holder: { pid, start_time: (await procStartTime(pid)) as string } };
}

/**
 * Connects to 127.0.0.1:`port` from inside `pid`'s namespace; what the connection read.
 * Asynchronous: the listener is in this process, which must go on accepting meanwhile.
 */
function connectInside(pid: number, port: number): Promise<string> {
  const script = `const s=require("net").connect(${port},"127.0.0.1");let t="";s.on("data",d=>t+=d);s.on("end",()=>{process.stdout.write(t)});s.on("error",e=>process.stdout.write("ERR "+e.code))`;
  return new Promise((resolve) => {
    const child = spawn("nsenter", [`--net=/proc/${pid}/ns/net`, process.execPath, "-e", script], {
      stdio: ["ignore", "pipe", "inherit"],
      timeout: 20_000,
    });
    let out = "";
    child.stdout?.on("data", (d: Buffer) => {
      out += d.toString("utf8");
    });
    child.on("close", () => resolve(out));
  });
}

function connectHere(port: number): Promise<string> {
  return new Promise((resolve) => {
    const s = net.connect(port, "127.0.0.1");
    s.on("connect", () => {
      s.destroy();
      resolve("connected");
    });
    s.on("error", (e: NodeJS.ErrnoException) => resolve(`ERR ${e.code}`));
  });
}

const PORT = 38128;

describe.skipIf(!can)(
  `listening in another network namespace${can ? "" : " (skipped: needs root and util-linux unshare)"}`,
  () => {
    let a: Awaited<ReturnType<typeof namespaceHolder>>;
    let b: Awaited<ReturnType<typeof namespaceHolder>>;
    beforeAll(async () => {
      a = await namespaceHolder();
      b = await namespaceHolder();
    });
    afterAll(() => {
      a?.child.kill("SIGKILL");
      b?.child.kill("SIGKILL");
    });

    it("listens inside the namespace only: reachable there, not from the host's loopback", async () => {
      expect(await connectHere(PORT)).toBe("ERR ECONNREFUSED");
      const { server, namespace } = await listenInNamespace(a.holder, PORT);
      try {
        expect(namespace).toBe(namespaceId(`/proc/${a.holder.pid}/ns/net`));
        expect(namespace).not.toBe(namespaceId("/proc/self/ns/net"));
        server.on("connection", (s) => s.end("hello from the host side"));
        expect(await connectInside(a.holder.pid, PORT)).toBe("hello from the host side");
        expect(await connectHere(PORT)).toBe("ERR ECONNREFUSED");
        expect(await connectInside(b.holder.pid, PORT)).toBe("ERR ECONNREFUSED");
      } finally {
        server.close();
      }
    });

    it("refuses the host's own namespace, a reused pid and a port taken in the namespace", async () => {
      const self = { pid: process.pid, start_time: (await procStartTime(process.pid)) as string };
      await expect(listenInNamespace(self, PORT)).rejects.toMatchObject({
        code: "backend_unavailable",
        message: expect.stringContaining("shares the host's network namespace"),
      });
      await expect(listenInNamespace({ ...a.holder, start_time: "1" }, PORT)).rejects.toMatchObject({
        message: expect.stringContaining("pid was reused"),
      });
      await expect(listenInNamespace({ pid: 2 ** 22 + 7, start_time: "1" }, PORT)).rejects.toMatchObject({
        message: expect.stringContaining("is gone"),
      });
      const first = await listenInNamespace(a.holder, PORT);
      try {
        await expect(listenInNamespace(a.holder, PORT)).rejects.toMatchObject({
          code: "backend_unavailable",
          message: expect.stringContaining("EADDRINUSE"),
        });
      } finally {
        first.server.close();
      }
    });

    it("SandboxListener attaches once per namespace and moves to a new one, closing the old", async () => {
      const seen: string[] = [];
      const listener = new SandboxListener((s) => {
        seen.push("conn");
        s.end("proxy");
      }, PORT);
      try {
        await listener.attach(a.holder);
        await listener.attach(a.holder); // the same namespace: nothing new (no EADDRINUSE)
        expect(await connectInside(a.holder.pid, PORT)).toBe("proxy");
        await listener.attach(b.holder);
        expect(await connectInside(b.holder.pid, PORT)).toBe("proxy");
        expect(await connectInside(a.holder.pid, PORT)).toBe("ERR ECONNREFUSED");
        expect(seen).toEqual(["conn", "conn"]);
      } finally {
        listener.close();
      }
      expect(await connectInside(b.holder.pid, PORT)).toBe("ERR ECONNREFUSED");
    });
  },
);
