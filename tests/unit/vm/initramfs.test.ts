import { spawnSync } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { STAGE1_INIT } from "../../../src/backends/vm/initramfs.js";
import { DISK_SERIAL, GUEST } from "../../../src/backends/vm/types.js";
import { which } from "../../../src/util/run.js";

const busybox = await which("busybox");
const noBusybox = busybox ? "" : "busybox is not installed";

/** Runs `script` with `shell` (argv), returning status and output. */
function sh(shell: string[], script: string, args: string[] = []) {
  const r = spawnSync(shell[0]!, [...shell.slice(1), "-c", script, "sh", ...args], { encoding: "utf8" });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** The lines of the script that run something (no blanks, no comments). */
const lines = STAGE1_INIT.split("\n")
  .map((l) => l.trim())
  .filter((l) => l && !l.startsWith("#"));

function lineIndex(pattern: RegExp): number {
  const i = lines.findIndex((l) => pattern.test(l));
  expect(i, `a line matching ${pattern}`).toBeGreaterThanOrEqual(0);
  return i;
}

/** A shell function definition `name() { ... }` (up to the closing brace in column 0). */
function shellFunction(script: string, name: string): string {
  const m = new RegExp(`^${name}\\(\\) \\{[\\s\\S]*?^\\}$`, "m").exec(script);
  if (!m) throw new Error(`no function ${name} in the script`);
  return m[0];
}

describe("STAGE1_INIT", () => {
  let dir = "";
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "pyro-stage1-"));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("is a /bin/sh script that passes sh -n", () => {
    expect(STAGE1_INIT.startsWith("#!/bin/sh\n")).toBe(true);
    const r = spawnSync("sh", ["-n"], { input: STAGE1_INIT, encoding: "utf8" });
    expect(r.stderr).toBe("");
    expect(r.status).toBe(0);
  });

  it.skipIf(noBusybox)(
    `passes busybox sh -n (the shell that runs it)${noBusybox && ` (skipped: ${noBusybox})`}`,
    () => {
      const r = spawnSync(busybox!, ["sh", "-n"], { input: STAGE1_INIT, encoding: "utf8" });
      expect(r.stderr).toBe("");
      expect(r.status).toBe(0);
    },
  );

  it("has no unexpanded template placeholders", () => {
    expect(STAGE1_INIT).not.toMatch(/undefined|\[object Object\]/);
    // Shell parameter expansions survive as ${...}; nothing else of the template's does.
    for (const m of STAGE1_INIT.matchAll(/\$\{([^}]*)\}/g)) expect(m[1]).toMatch(/^(a|map|d)[#%]/);
  });

  it("mounts devtmpfs before anything else touches /dev, then proc and sys", () => {
    const devtmpfs = lineIndex(/^mount -t devtmpfs devtmpfs \/dev$/);
    const firstMount = lines.findIndex((l) => /\bmount\b/.test(l) || l.includes("/dev/"));
    expect(devtmpfs).toBe(firstMount);
    expect(lineIndex(/^exec <\/dev\/console >\/dev\/console 2>&1$/)).toBeGreaterThan(devtmpfs);
    expect(lineIndex(/^mount -t proc proc \/proc$/)).toBeGreaterThan(devtmpfs);
    expect(lineIndex(/^mount -t sysfs sysfs \/sys$/)).toBeGreaterThan(devtmpfs);
    // Only PATH is set before it (the shebang counts as a comment here).
    expect(lines.slice(0, devtmpfs)).toEqual(["export PATH=/bin"]);
  });

  it("finds the env, agent and state disks by their virtio serials, never the seed disk", () => {
    const env = lineIndex(new RegExp(`^env=\\$\\(wait_disk env ${DISK_SERIAL.env}\\) \\|\\| exit 1$`));
    const agent = lineIndex(
      new RegExp(`^agent=\\$\\(wait_disk agent ${DISK_SERIAL.agent}\\) \\|\\| exit 1$`),
    );
    const state = lineIndex(
      new RegExp(`^state=\\$\\(wait_disk state ${DISK_SERIAL.state}\\) \\|\\| exit 1$`),
    );
    const firstDiskMount = lineIndex(/^mount -t ext4 /);
    expect(Math.max(env, agent, state)).toBeLessThan(firstDiskMount);
    // The seed disk is the agent's business (vm_setup), after the template was saved.
    expect(STAGE1_INIT).not.toContain(DISK_SERIAL.seed);
    // The serial lookup reads /sys/block/vd*/serial.
    expect(shellFunction(STAGE1_INIT, "disk")).toContain('"$d/serial"');
  });

  it("mounts env and agent read-only and state read-write", () => {
    const opts = (dev: string) => {
      const l = lines.find((x) => x.startsWith("mount -t ext4 ") && x.includes(`"$${dev}" /mnt/${dev}`));
      expect(l, `mount of ${dev}`).toBeDefined();
      return /-o (\S+)/.exec(l!)![1]!.split(",");
    };
    expect(opts("env")).toContain("ro");
    expect(opts("agent")).toContain("ro");
    expect(opts("state")).toContain("rw");
    expect(opts("state")).not.toContain("ro");
  });

  it("overlays the root (env lower, state upper) and moves the agent and state disks under /run/pyro", () => {
    const overlay = lineIndex(
      /^mount -t overlay overlay -o lowerdir=\/mnt\/env,upperdir=\/mnt\/state\/root\/upper,workdir=\/mnt\/state\/root\/work \/newroot /,
    );
    expect(lineIndex(/^mkdir -p .*\/mnt\/state\/root\/upper .*\/mnt\/state\/root\/work/)).toBeLessThan(
      overlay,
    );
    const moveAgent = lineIndex(new RegExp(`^mount --move /mnt/agent /newroot${GUEST.agentDir}$`));
    const moveState = lineIndex(new RegExp(`^mount --move /mnt/state /newroot${GUEST.stateDir}$`));
    expect(Math.min(moveAgent, moveState)).toBeGreaterThan(overlay);
  });

  it("switch_roots to the agent disk's busybox running stage 2, and dies if that fails", () => {
    const sw = lineIndex(/^exec switch_root /);
    expect(lines[sw]).toBe(
      `exec switch_root /newroot ${GUEST.agentDir}/bin/busybox sh ${GUEST.agentDir}/stage2.sh`,
    );
    expect(lines[sw + 1]).toMatch(/^die /);
    expect(sw).toBe(lines.length - 2);
  });

  it("collects virtio_mmio.device= and pyro.disks= from the kernel command line", async () => {
    const cmdline = join(dir, "cmdline");
    await writeFile(
      cmdline,
      "console=ttyS0 virtio_mmio.device=4K@0xfeb00e00:12 quiet virtio_mmio.device=4K@0xfeb00c00:13 pyro.disks=env:vda,agent:vdb\n",
    );
    const loop = /^for a in \$\(cat \/proc\/cmdline\); do[\s\S]*?^done$/m.exec(STAGE1_INIT)?.[0];
    expect(loop).toBeDefined();
    const r = sh(
      ["sh"],
      `mmio=""; disks=""\n${loop!.replace("/proc/cmdline", '"$1"')}\nprintf '%s|%s' "$mmio" "$disks"`,
      [cmdline],
    );
    expect(r.stderr).toBe("");
    expect(r.stdout).toBe(" device=4K@0xfeb00e00:12 device=4K@0xfeb00c00:13|env:vda,agent:vdb");
  });

  it("maps a disk name through pyro.disks= before looking at serials", () => {
    const disk = shellFunction(STAGE1_INIT, "disk");
    const r = sh(
      ["sh"],
      `${disk}\ndisks="env:vda,agent:vdc,state:vdb"\ndisk agent ${DISK_SERIAL.agent}; echo " $?"\ndisk state x; echo " $?"`,
    );
    expect(r.stdout).toBe("/dev/vdc\n 0\n/dev/vdb\n 0\n");
  });
});
