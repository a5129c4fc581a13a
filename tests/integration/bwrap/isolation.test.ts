import { writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:net";
import { hostname } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bwrapSkipReason, errorOf, type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";

/**
 * What a bwrap workspace must not be able to do or see. Each probe runs as the sandbox's
 * root user, which is the strongest position a workspace command can be in.
 */
const skip = bwrapSkipReason();

describe.skipIf(skip !== "")(suiteTitle("bwrap isolation", skip), () => {
  let h: Harness;
  let id: string;
  const run = async (command: string) => h.pyro.execWorkspace(id, command, { timeoutSeconds: 60 });

  beforeAll(async () => {
    h = await openHarness("isolation");
    id = (await h.create()).workspace_id;
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("cannot read a host file by its host path, through a command or the file tools", async () => {
    const dir = await h.tempDir("isolation-marker");
    const marker = join(dir, "marker.txt");
    await writeFile(marker, "host-secret-4711\n");
    const r = await run(`cat ${marker}`);
    expect(r.exit_code, `workspace ${id}`).not.toBe(0);
    expect(r.stdout).not.toContain("host-secret-4711");
    expect((await errorOf(h.pyro.readWorkspaceFile(id, marker))).code).toBe("path_outside_workspace");
    // Nor pyro's own state: the store of every workspace lives in the home.
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

  it("cannot connect to a TCP service listening on the host's loopback", async () => {
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
      expect(r.exit_code, `workspace ${id}`).not.toBe(0);
      expect(r.stdout).not.toContain("hello-from-host");
      expect(r.stderr).toMatch(/Connection refused|unreachable|timed out/i);
      expect(connections).toBe(0);
    } finally {
      await new Promise((r) => server.close(r));
    }
  });

  it("has no network interface but lo", async () => {
    const r = await run("cat /proc/net/dev");
    expect(r.exit_code).toBe(0);
    const interfaces = r.stdout
      .split("\n")
      .slice(2)
      .filter((l) => l.includes(":"))
      .map((l) => l.split(":")[0]!.trim());
    expect(interfaces).toEqual(["lo"]);
  });

  it("runs with no effective, permitted, inheritable or ambient capabilities, no_new_privs and a seccomp filter", async () => {
    // grep is itself exec'd inside the sandbox, so this also shows exec grants nothing back.
    const r = await run("grep -E '^(CapInh|CapPrm|CapEff|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status");
    const status = Object.fromEntries(
      r.stdout
        .trim()
        .split("\n")
        .map((l) => l.split(/:\s+/) as [string, string]),
    );
    expect(status).toEqual({
      CapInh: "0000000000000000",
      CapPrm: "0000000000000000",
      CapEff: "0000000000000000",
      CapAmb: "0000000000000000",
      NoNewPrivs: "1",
      Seccomp: "2",
    });
    expect((await run("id -u")).stdout).toBe("0\n");
  });

  it("cannot mount a filesystem or create a user namespace", async () => {
    const mount = await run("mount -t tmpfs x /mnt");
    expect(mount.exit_code).not.toBe(0);
    expect((await run("grep -c ' /mnt ' /proc/self/mountinfo")).stdout).toBe("0\n");
    const userns = await run("unshare -U true");
    expect(userns.exit_code).not.toBe(0);
    expect(userns.stderr).toMatch(/Operation not permitted|Permission denied/);
  });

  it("has its own hostname and sees only its own processes", async () => {
    const name = (await run("hostname")).stdout.trim();
    expect(name).not.toBe("");
    expect(name).not.toBe(hostname());
    const procs = await run("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done");
    expect(procs.stdout).not.toMatch(/vitest|process_api|systemd/);
    // bwrap's init, the agent, this shell and the loop: a handful, not the host's hundreds.
    expect(procs.stdout.trim().split("\n").length).toBeLessThan(12);
  });

  it("kills a command that allocates beyond the 1024 MiB memory limit, and the workspace stays usable", {
    timeout: 90_000,
  }, async () => {
    expect((await h.pyro.getWorkspace(id)).limits.memory_mib).toBe(1024);
    // Within the limit the same allocation works: the failure below is the limit, not python.
    const small = await run('python3 -c "b=bytearray(300*1024*1024); print(len(b))"');
    expect(small.stdout, `workspace ${id}: ${small.stderr}`).toBe(`${300 * 1024 * 1024}\n`);
    const big = await run('python3 -c "b=bytearray(1500*1024*1024)"');
    expect(big.timed_out).toBe(false);
    // The cgroup OOM killer sends SIGKILL: the shell reports 128 + 9.
    expect(big.exit_code, `workspace ${id}: ${big.stderr}`).toBe(137);
    expect((await run("echo alive")).stdout).toBe("alive\n");
  });
});
