import { writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:net";
import { hostname } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { dockerSkipReason, type TestEngine, useTestEngine } from "../../helpers/docker.js";
import { errorOf, type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";

/**
 * What a docker workspace's container must not be able to do or see, and its limits. One
 * workspace; the probes run as the container's root user, the strongest position a command
 * can be in. Backend-specific: these are the engine's confinement (capabilities, seccomp,
 * namespaces, cgroup limits) as docker sets it up; what a command's results, env, cwd,
 * caps and timeout are is the parity suite's (tests/parity/exec.ts).
 */
const skip = dockerSkipReason();

describe.skipIf(skip !== "")(suiteTitle("isolation on docker", skip), () => {
  let engine: TestEngine;
  let h: Harness;
  let id: string;
  const run = async (command: string) => h.pyro.execWorkspace(id, command, { timeoutSeconds: 60 });

  beforeAll(async () => {
    engine = await useTestEngine();
    h = await openHarness("docker-isolation", { backend: "docker" }, { env: engine.env });
    id = (await h.create({ memoryMib: 512 })).workspace_id;
  });
  afterAll(async () => {
    await h?.cleanup();
    await engine?.release();
  });

  it("cannot read a host file by its host path, through a command or the file tools", async () => {
    const dir = await h.tempDir("docker-marker");
    const marker = join(dir, "marker.txt");
    await writeFile(marker, "host-secret-4711\n");
    const r = await run(`cat ${marker}`);
    expect(r.exit_code).not.toBe(0);
    expect(r.stdout).not.toContain("host-secret-4711");
    expect((await errorOf(h.pyro.readWorkspaceFile(id, marker))).code).toBe("path_outside_workspace");
    expect((await run(`test -e ${join(h.home, "state.db")}`)).exit_code).toBe(1);
    // The injected runtime and pyro's package are there, read-only.
    const ro = await run("touch /run/pyro/runtime/x /run/pyro/app/x /run/pyro/snapshots/x");
    expect(ro.exit_code).not.toBe(0);
    expect(ro.stderr).toMatch(/Read-only file system/);
  });

  it("has no network interface but lo, and cannot reach a service on the host's loopback", async () => {
    const dev = await run("cat /proc/net/dev");
    const interfaces = dev.stdout
      .split("\n")
      .slice(2)
      .filter((l) => l.includes(":"))
      .map((l) => l.split(":")[0]!.trim());
    expect(interfaces).toEqual(["lo"]);
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
      expect(r.stderr).toMatch(/Connection refused|unreachable|timed out/i);
      expect(connections).toBe(0);
    } finally {
      await new Promise((r) => server.close(r));
    }
  });

  it("runs with no capabilities, no_new_privs and a seccomp filter, and cannot mount or make a user namespace", async () => {
    const r = await run(
      "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status",
    );
    expect(
      Object.fromEntries(
        r.stdout
          .trim()
          .split("\n")
          .map((l) => l.split(/:\s+/) as [string, string]),
      ),
    ).toEqual({
      CapInh: "0000000000000000",
      CapPrm: "0000000000000000",
      CapEff: "0000000000000000",
      CapBnd: "0000000000000000",
      CapAmb: "0000000000000000",
      NoNewPrivs: "1",
      Seccomp: "2",
    });
    expect((await run("id -u")).stdout).toBe("0\n");
    expect((await run("mount -t tmpfs x /mnt")).exit_code).not.toBe(0);
    const userns = await run("unshare -U true");
    expect(userns.exit_code).not.toBe(0);
    expect(userns.stderr).toMatch(/Operation not permitted|Permission denied/);
  });

  it("has its own hostname, sees only its own processes, and has an init as pid 1", async () => {
    const name = (await run("hostname")).stdout.trim();
    expect(name).toMatch(/^pyro-/);
    expect(name).not.toBe(hostname());
    const procs = await run("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done");
    expect(procs.stdout).not.toMatch(/vitest|dockerd|containerd/);
    expect(procs.stdout.trim().split("\n").length).toBeLessThan(12);
    expect((await run("tr '\\0' ' ' < /proc/1/cmdline")).stdout).toMatch(/init/);
  });

  it("applies the memory and pids limits: an allocation beyond them is killed, and the workspace stays usable", {
    timeout: 90_000,
  }, async () => {
    expect((await h.pyro.getWorkspace(id)).limits.memory_mib).toBe(512);
    const small = await run('python3 -c "b=bytearray(200*1024*1024); print(len(b))"');
    expect(small.stdout, `workspace ${id}: ${small.stderr}`).toBe(`${200 * 1024 * 1024}\n`);
    const big = await run('python3 -c "b=bytearray(900*1024*1024)"');
    expect(big.timed_out).toBe(false);
    expect(big.exit_code, `workspace ${id}: ${big.stderr}`).toBe(137);
    const pids = await run("cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max");
    expect(pids.stdout.trim()).toBe("1024");
    expect((await run("echo alive")).stdout).toBe("alive\n");
  });
});
