import { statSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:net";
import { hostname, release } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { probePlatforms } from "../../../src/backends/gvisor/platform.js";
import { which } from "../../../src/util/run.js";
import { errorOf, gvisorSkipReason, type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";

/**
 * What a gVisor workspace must not be able to do or see, probed as the sandbox's root
 * user. The boundary is gVisor's user-space kernel: the guest never talks to the host
 * kernel, so it sees gVisor's kernel version, log, network stack and processes.
 */
const skip = gvisorSkipReason();

describe.skipIf(skip !== "")(suiteTitle("gvisor isolation", skip), () => {
  let h: Harness;
  let id: string;
  const run = async (command: string) => h.pyro.execWorkspace(id, command, { timeoutSeconds: 60 });

  beforeAll(async () => {
    h = await openHarness("gvisor-isolation", { backend: "gvisor" });
    id = (await h.create()).workspace_id;
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("leaves the host's /dev/null as it was: runsc gives its stdio to the sandbox's user, never the host's /dev/null", async () => {
    // runsc fchowns its stdin, stdout and stderr to nobody at every start; the platform
    // probe (pyro doctor) gave it the host's /dev/null as stdin, whose owner and ctime
    // then changed under every bwrap sandbox that binds it.
    const before = statSync("/dev/null");
    const verdict = await probePlatforms((await which("runsc"))!, {
      timeoutMs: 60_000,
      kvm: async () => ({ present: false, usable: false, reason: "not tried here" }),
    });
    expect(verdict.platform).toBeTruthy();
    await h.pyro.run("debian:12", "true", { backend: "gvisor" });
    await run("true");
    const after = statSync("/dev/null");
    expect([after.uid, after.ctimeMs]).toEqual([before.uid, before.ctimeMs]);
  });

  it("runs on gVisor's kernel, not the host's: another kernel release and gVisor's own log", async () => {
    const r = await run("uname -r; dmesg | head -1");
    expect(r.exit_code, r.stderr).toBe(0);
    const [kernel, firstLog] = r.stdout.split("\n");
    expect(kernel).not.toBe(release());
    expect(firstLog).toContain("Starting gVisor");
  });

  it("cannot read a host file by its host path, through a command or the file tools", async () => {
    const dir = await h.tempDir("gvisor-marker");
    const marker = join(dir, "marker.txt");
    await writeFile(marker, "host-secret-4711\n");
    const r = await run(`cat ${marker}`);
    expect(r.exit_code).not.toBe(0);
    expect(r.stdout).not.toContain("host-secret-4711");
    expect((await errorOf(h.pyro.readWorkspaceFile(id, marker))).code).toBe("path_outside_workspace");
    expect((await run(`test -e ${join(h.home, "state.db")}`)).exit_code).toBe(1);
  });

  it("cannot write past its disk limit into its socket directory, the one host directory it can write", async () => {
    const r = await run("dd if=/dev/zero of=/run/pyro/sock/fill bs=64k count=64 2>&1; echo rc=$?");
    expect(r.stdout).toMatch(/No space left on device/);
    expect(r.stdout).not.toMatch(/rc=0/);
    // Nor by many small files (inodes), and the workspace keeps working afterwards.
    const n = await run(
      "i=0; while [ $i -lt 2000 ] && : > /run/pyro/sock/f$i 2>/dev/null; do i=$((i+1)); done; echo $i",
    );
    expect(Number(n.stdout.trim())).toBeLessThan(2000);
    await run("rm -f /run/pyro/sock/f* /run/pyro/sock/fill");
    expect((await run("echo ok")).stdout).toBe("ok\n");
  });

  it("cannot connect to a TCP service on the host's loopback, and has no interface but lo", async () => {
    let connections = 0;
    const server: Server = createServer((s) => {
      connections++;
      s.end("hello-from-host");
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const port = (server.address() as { port: number }).port;
    try {
      const r = await run(
        `python3 -c "import socket; s = socket.create_connection(('127.0.0.1', ${port}), timeout=3); print(s.recv(100))"`,
      );
      expect(r.exit_code).not.toBe(0);
      expect(r.stdout).not.toContain("hello-from-host");
      expect(r.stderr).toMatch(/Connection refused|unreachable|timed out/i);
      expect(connections).toBe(0);
    } finally {
      await new Promise((r) => server.close(r));
    }
    const dev = await run("cat /proc/net/dev");
    const interfaces = dev.stdout
      .split("\n")
      .slice(2)
      .filter((l) => l.includes(":"))
      .map((l) => l.split(":")[0]!.trim());
    expect(interfaces).toEqual(["lo"]);
  });

  it("runs as uid 0 with no capabilities, and cannot mount", async () => {
    // gVisor's /proc/PID/status has no CapAmb line; the bounding set is empty too.
    const r = await run("grep -E '^Cap(Inh|Prm|Eff|Bnd):' /proc/self/status; id -u");
    expect(r.stdout).toBe(
      "CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\n0\n",
    );
    const mount = await run("mount -t tmpfs x /mnt");
    expect(mount.exit_code).not.toBe(0);
  });

  it("has its own hostname and sees only its own few processes", async () => {
    const name = (await run("hostname")).stdout.trim();
    expect(name).toMatch(/^pyro-/);
    expect(name).not.toBe(hostname());
    const procs = await run("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done");
    expect(procs.stdout).not.toMatch(/vitest|runsc|systemd/);
    // The init shell, the agent, this shell and the loop.
    expect(procs.stdout.trim().split("\n").length).toBeLessThan(8);
  });

  it("keeps guest unix sockets working under /workspace (host-backed sockets stay usable inside)", async () => {
    const r = await run(
      `python3 -c "
import socket, threading
s = socket.socket(socket.AF_UNIX); s.bind('/workspace/t.sock'); s.listen(1)
threading.Thread(target=lambda: s.accept()[0].sendall(b'pong')).start()
c = socket.socket(socket.AF_UNIX); c.connect('/workspace/t.sock'); print(c.recv(4).decode())
"; rm -f /workspace/t.sock`,
    );
    expect([r.exit_code, r.stdout, r.stderr]).toEqual([0, "pong\n", ""]);
  });

  it("sees its 1024 MiB limit; beyond it the sandbox is killed as a whole and comes back with its files", {
    timeout: 120_000,
  }, async () => {
    expect((await h.pyro.getWorkspace(id)).limits.memory_mib).toBe(1024);
    expect((await run("head -1 /proc/meminfo")).stdout).toMatch(/^MemTotal:\s+1048576 kB/);
    const small = await run('python3 -c "b=bytearray(300*1024*1024); print(len(b))"');
    expect(small.stdout, small.stderr).toBe(`${300 * 1024 * 1024}\n`);
    await h.pyro.writeWorkspaceFile(id, "survivor.txt", "kept\n");
    // gVisor has no OOM killer of its own: the host cgroup's kills the whole sandbox, so
    // the call fails (the channel dies) instead of reporting exit 137 as bwrap does.
    const big = await errorOf(run('python3 -c "b=bytearray(1500*1024*1024)"'));
    expect(["backend_unavailable", "agent_disconnected"]).toContain(big.code);
    expect((await run("echo alive; cat survivor.txt")).stdout).toBe("alive\nkept\n");
  });
});
