import { spawnSync } from "node:child_process";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  NET_PORT_NAME,
  packageClosure,
  SERIAL_PORT_PREFIX,
  SETUP_PORT_NAME,
  setupServerArgs,
  stage2Script,
} from "../../../src/backends/vm/agent-disk.js";
import { AGENT_VSOCK_PORT, DISK_SERIAL, GUEST, NET_VSOCK_PORT } from "../../../src/backends/vm/types.js";
import { which } from "../../../src/util/run.js";

const busybox = await which("busybox");
const noBusybox = busybox ? "" : "busybox is not installed";

/** Arguments that break naive quoting. */
const TRICKY = [
  "/run/pyro/agent/runtime/bin/node",
  "--flag=a b",
  "it's",
  '"double"',
  "$HOME",
  "`id`",
  "a\\b",
  "'",
  "",
  "*",
  "x;y",
];
const BRIDGE = `${GUEST.agentDir}/bin/pyro vsock bridge's`;

let dir = "";
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-agent-disk-"));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/**
 * Runs a stage 2 script on the host with its side effects stubbed: busybox is a shell
 * function that logs its applets (and really runs `cat`, for /proc/cmdline), the command
 * line comes from a file, and `keep` logs its argv instead of looping. Returns the log.
 */
async function runStage2(script: string, cmdline: string, shell: string[]): Promise<string[]> {
  const tag = Math.random().toString(36).slice(2);
  const cmdlineFile = join(dir, `cmdline-${tag}`);
  const log = join(dir, `log-${tag}`);
  await writeFile(cmdlineFile, cmdline);
  await writeFile(log, "");
  const stubbed = script
    .replace(/^B=.*$/m, "B=fakebb")
    .replace("/proc/cmdline", `"${cmdlineFile}"`)
    // Every background job, not only the last: the bridge's stub must have logged too.
    .replace(/^wait \$!$/m, "wait")
    .replace(
      /^keep\(\) \{.*\}$/m,
      `keep() { l=$(printf '<%s>' keep "$@"); printf '%s\\n' "$l" >>"${log}"; }`,
    );
  expect(stubbed).toContain("B=fakebb");
  expect(stubbed).toContain(cmdlineFile);
  expect(stubbed).toContain(log);
  const prelude = `fakebb() { if [ "$1" = cat ]; then shift; cat "$@"; else echo "bb $*" >>"${log}"; fi; }\n`;
  const body = stubbed.replace(/^#!.*\n/, "");
  const r = spawnSync(shell[0]!, [...shell.slice(1), "-c", prelude + body], { encoding: "utf8" });
  expect(r.stderr).toBe("");
  expect(r.status).toBe(0);
  return (await readFile(log, "utf8")).split("\n").filter(Boolean);
}

/** The `keep` line's expected log entry. */
const kept = (...argv: string[]) => ["keep", ...argv].map((a) => `<${a}>`).join("");

const shells: [string, string[], string][] = [
  ["sh", ["sh"], ""],
  ["busybox sh", [busybox ?? "busybox", "sh"], noBusybox],
];

describe("stage2Script", () => {
  for (const bridge of [BRIDGE, null]) {
    it(`passes sh -n (bridge: ${bridge ? "yes" : "none"})`, () => {
      const r = spawnSync("sh", ["-n"], { input: stage2Script(TRICKY, bridge), encoding: "utf8" });
      expect(r.stderr).toBe("");
      expect(r.status).toBe(0);
    });
  }

  it("runs under the agent disk's busybox, with the serial channel as the default", () => {
    const s = stage2Script(["node", "main.js"], BRIDGE);
    expect(s.startsWith(`#!${GUEST.agentDir}/bin/busybox sh\n`)).toBe(true);
    expect(s).toContain("channel=serial\n");
    expect(s).toContain(`'node' 'main.js' --serial ${SERIAL_PORT_PREFIX} --net-mux ${NET_PORT_NAME} &`);
    expect(SERIAL_PORT_PREFIX).toBe("pyro.agent.");
    expect(s).toContain(
      `keep 'node' 'main.js' --listen ${GUEST.agentSocket} --net-listen ${GUEST.netSocket} &`,
    );
    expect(s).toContain(`keep '${BRIDGE.replace(/'/g, "'\\''")}' ${AGENT_VSOCK_PORT} ${GUEST.agentSocket} &`);
    expect(s).toContain(`keep '${BRIDGE.replace(/'/g, "'\\''")}' ${NET_VSOCK_PORT} ${GUEST.netSocket} &`);
  });

  it("without a bridge, the vsock branch powers the VM off with a message", () => {
    const s = stage2Script(["node", "main.js"], null);
    expect(s).not.toContain("pyro-vsock-bridge");
    const vsock = /if \[ "\$channel" = vsock \]; then\n([\s\S]*?)\nelse/.exec(s)?.[1];
    expect(vsock).toBeDefined();
    expect(vsock).toContain("no vsock bridge");
    expect(vsock).toContain("$B poweroff -f");
  });

  for (const [name, shell, skip] of shells) {
    const title = (t: string) => `${t} (${name})${skip && ` (skipped: ${skip})`}`;

    it.skipIf(skip)(
      title("serial channel: the agent gets its argv back exactly, plus --serial"),
      async () => {
        const log = await runStage2(stage2Script(TRICKY, BRIDGE), "console=ttyS0 quiet\n", shell);
        expect(log).toContain(kept(...TRICKY, "--serial", SERIAL_PORT_PREFIX, "--net-mux", NET_PORT_NAME));
        expect(log.filter((l) => l.startsWith("<keep>"))).toHaveLength(1);
        // The rest of the setup went through busybox.
        expect(log).toContain("bb hostname pyro");
        expect(log).toContain("bb mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /dev/pts");
      },
    );

    it.skipIf(skip)(title("vsock channel: the bridge and the agent on the unix socket"), async () => {
      const log = await runStage2(stage2Script(TRICKY, BRIDGE), "quiet pyro.channel=vsock\n", shell);
      const keeps = log.filter((l) => l.startsWith("<keep>")).sort();
      expect(keeps).toEqual(
        [
          kept(BRIDGE, String(AGENT_VSOCK_PORT), GUEST.agentSocket),
          kept(BRIDGE, String(NET_VSOCK_PORT), GUEST.netSocket),
          kept(...TRICKY, "--listen", GUEST.agentSocket, "--net-listen", GUEST.netSocket),
        ].sort(),
      );
      expect(log).not.toContain("bb poweroff -f");
    });

    it.skipIf(skip)(
      title("with the setup helper: its server starts before the agent, on either channel"),
      async () => {
        const helper = `${GUEST.agentDir}/bin/pyro-vmsetup`;
        // On the serial channel (qemu) it also serves its own port; vsock guests have none.
        for (const [cmdline, port] of [
          ["quiet\n", [SETUP_PORT_NAME]],
          ["pyro.channel=vsock\n", []],
        ] as const) {
          const script = stage2Script(TRICKY, BRIDGE, helper);
          const log = await runStage2(script, cmdline, shell);
          const keeps = log.filter((l) => l.startsWith("<keep>"));
          expect(keeps).toContain(
            kept(
              helper,
              "--serve",
              GUEST.setupSocket,
              DISK_SERIAL.seed,
              GUEST.seedDir,
              GUEST.workspaceUpper,
              GUEST.workspaceWork,
              GUEST.workspace,
              ...port,
            ),
          );
          expect(keeps.some((k) => k.startsWith(kept(...TRICKY)))).toBe(true);
          // Started first (in the script's order): a template saved once the agent answers has it running.
          expect(script.indexOf("--serve")).toBeLessThan(script.indexOf("'--flag=a b'"));
        }
        expect(setupServerArgs()[0]).toBe("--serve");
      },
    );

    it.skipIf(skip)(title("vsock channel without a bridge: powers off"), async () => {
      const log = await runStage2(stage2Script(TRICKY, null), "pyro.channel=vsock\n", shell);
      expect(log).toContain("bb poweroff -f");
      expect(log.some((l) => l.includes(BRIDGE))).toBe(false);
    });
  }
});

describe("packageClosure", () => {
  async function pkg(name: string, deps: Record<string, string> = {}, extra: object = {}) {
    await mkdir(join(dir, "app", "node_modules", name), { recursive: true });
    await writeFile(
      join(dir, "app", "node_modules", name, "package.json"),
      JSON.stringify({ name, version: "1.0.0", dependencies: deps, ...extra }),
    );
  }

  beforeAll(async () => {
    await pkg("tar", { minipass: "^7", "@isaacs/fs-minipass": "^4", chownr: "^3" });
    await pkg("minipass");
    await pkg("@isaacs/fs-minipass", { minipass: "^7" });
    await pkg("chownr", { tar: "*" }); // a cycle back to a root
    await pkg("zod", {}, { devDependencies: { typescript: "*" }, peerDependencies: { nope: "*" } });
    await pkg("unrelated", { zod: "*" });
    await mkdir(join(dir, "app", "node_modules", "typescript"), { recursive: true });
    await writeFile(join(dir, "app", "node_modules", "typescript", "package.json"), "{}");
    // A package.json without dependencies at all.
    await mkdir(join(dir, "app", "node_modules", "diff"), { recursive: true });
    await writeFile(join(dir, "app", "node_modules", "diff", "package.json"), '{"name":"diff"}');
  });

  it("follows dependencies of dependencies, each once, sorted", async () => {
    expect(await packageClosure(join(dir, "app"), ["zod", "tar", "diff"])).toEqual([
      "@isaacs/fs-minipass",
      "chownr",
      "diff",
      "minipass",
      "tar",
      "zod",
    ]);
  });

  it("ignores dev and peer dependencies and unrelated packages", async () => {
    expect(await packageClosure(join(dir, "app"), ["zod"])).toEqual(["zod"]);
    expect(await packageClosure(join(dir, "app"), [])).toEqual([]);
  });

  it("fails when a dependency is not installed", async () => {
    await pkg("broken", { missing: "*" });
    await expect(packageClosure(join(dir, "app"), ["broken"])).rejects.toMatchObject({ code: "ENOENT" });
  });
});
