import { spawnSync } from "node:child_process";
import { mkdir } from "node:fs/promises";
import net from "node:net";
import path from "node:path";
import type { Duplex } from "node:stream";
import { afterEach, describe, expect, it } from "vitest";
import type { OpHandler } from "../../../src/agent/guest/ops/context.js";
import { BUILTIN_OPS } from "../../../src/agent/guest/ops/index.js";
import { Workspace } from "../../../src/agent/guest/paths.js";
import { serveConnection } from "../../../src/agent/server.js";
import { setupSocket } from "../../../src/backends/qemu/machine.js";
import { describeSetupHelper, HELPER_PROBE } from "../../../src/backends/qemu/setup-diagnosis.js";
import { askSetupPort } from "../../../src/backends/qemu/setup-port.js";
import { GUEST } from "../../../src/backends/vm/types.js";
import type { PyroError } from "../../../src/errors.js";
import { onPath } from "../../helpers/sandbox.js";
import { duplexPair, tempDir } from "../agent/helpers.js";

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** QEMU's socket of the setup port, as a stand-in: answers `reply` `afterMs` after the request line (never: null). */
async function slowPort(reply: string | null, afterMs = 0) {
  const t = await tempDir("pyro-setup-diag-");
  cleanups.push(t.cleanup);
  const server = net.createServer((c) => {
    c.on("data", (d) => {
      if (reply !== null && d.includes("\n")) setTimeout(() => c.write(reply), afterMs);
    });
    c.on("error", () => {});
  });
  await new Promise<void>((r) => server.listen(setupSocket(t.dir), r));
  cleanups.push(() => new Promise<void>((r) => server.close(() => r())));
  return t.dir;
}

/** An in-process agent whose exec is `exec`; each connect is a new session. */
async function fakeAgent(exec: OpHandler<"exec">) {
  const t = await tempDir("pyro-setup-diag-agent-");
  cleanups.push(t.cleanup);
  await mkdir(path.join(t.dir, "root"));
  const workspace = await Workspace.open(path.join(t.dir, "root"));
  const commands: string[] = [];
  return {
    commands,
    connect: async (): Promise<Duplex> => {
      const [hostEnd, agentEnd] = duplexPair();
      const served = serveConnection(agentEnd, {
        workspace,
        handlers: {
          ...BUILTIN_OPS,
          exec: (args, ctx) => {
            commands.push(args.command);
            return exec(args, ctx);
          },
        },
        tmpDir: t.dir,
      });
      cleanups.push(async () => {
        hostEnd.destroy();
        await served;
      });
      return hostEnd;
    },
  };
}

const result = (stdout: string) => ({
  exit_code: 0,
  stdout,
  stderr: "",
  stdout_bytes: stdout.length,
  stderr_bytes: 0,
  duration_ms: 1,
  timed_out: false,
  truncated: false,
});

describe("askSetupPort without a reply in time", () => {
  it("says what the guest shows of its helper in the timeout error", async () => {
    const sockets = await slowPort(null);
    const err = (await askSetupPort(sockets, "h 1 00\n", {
      timeoutMs: 200,
      describe: async () => "helper 151: state S wchan do_sys_poll",
    }).catch((e: unknown) => e)) as PyroError;
    expect(err.code).toBe("timeout");
    expect(err.message).toBe(
      "the VM's setup helper did not answer within 200 ms (guest: helper 151: state S wchan do_sys_poll)",
    );
  });

  it("a reply that comes while the guest is asked still counts", async () => {
    const sockets = await slowPort("ok mounted=1\n", 300);
    const mounted = await askSetupPort(sockets, "h 1 00\n", {
      timeoutMs: 100,
      describe: () => new Promise((r) => setTimeout(() => r("late"), 2000)),
    });
    expect(mounted).toBe(true);
  });
});

describe("describeSetupHelper", () => {
  it("runs the probe through the agent and shows its output printable, on one line", async () => {
    const agent = await fakeAgent(async () =>
      result("helper 151: state S\x1b[2J\nports: vport0p1=pyro.setup\n"),
    );
    expect(await describeSetupHelper(agent.connect)).toBe(
      "helper 151: state S?[2J ports: vport0p1=pyro.setup",
    );
    expect(agent.commands).toEqual([HELPER_PROBE]);
  });

  it("never throws: an agent it cannot reach is said so", async () => {
    const why = await describeSetupHelper(async () => {
      throw new Error("connect ENOENT p7");
    });
    expect(why).toBe("(the agent could not be asked: connect ENOENT p7)");
  });

  const noBusybox = onPath("busybox") ? "" : " (skipped: busybox is not installed, npm run setup)";
  it.skipIf(noBusybox !== "")(
    `the probe is valid shell that reports a guest without a helper server${noBusybox}`,
    () => {
      // On this host, with the host's busybox for the agent disk's: no server, no socket.
      const probe = HELPER_PROBE.replace(`B=${GUEST.agentDir}/bin/busybox`, "B=busybox");
      const r = spawnSync("sh", ["-c", probe], { encoding: "utf8" });
      expect(r.status).toBe(0);
      expect(r.stdout).toContain("no pyro-vmsetup server running");
      expect(r.stdout).toContain(`no ${GUEST.setupSocket}`);
      expect(r.stdout).toMatch(/^ports:/m);
    },
  );
});
