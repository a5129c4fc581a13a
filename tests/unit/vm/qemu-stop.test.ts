import { existsSync } from "node:fs";
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { procStartTime, sameProcessAlive, spawnDetached } from "../../../src/backends/common.js";
import { QemuBackend, qemuLayout } from "../../../src/backends/qemu/backend.js";
import { tempDir } from "../agent/helpers.js";

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/**
 * A stand-in for a workspace's QEMU: a detached process that leaves a mark when it gets
 * SIGTERM (and then exits, as QEMU does), once it has said its trap is set, recorded as the qemu backend records its VM.
 * No agent answers on its sockets, so a sync before a graceful stop fails at once.
 */
async function fakeVm() {
  const t = await tempDir("pyro-qemu-stop-");
  cleanups.push(t.cleanup);
  const l = qemuLayout(t.dir);
  await mkdir(l.sockets);
  const termMark = join(t.dir, "got-sigterm");
  const ready = join(t.dir, "trap-set");
  const { pid } = spawnDetached(
    ["sh", "-c", `trap 'echo > "${termMark}"; exit 0' TERM; echo > "${ready}"; while :; do sleep 0.05; done`],
    { logFile: l.log },
  );
  // Not before its trap is set: a SIGTERM that came first would end it without a mark
  // (seen on a busy machine).
  while (!existsSync(ready)) await new Promise((r) => setTimeout(r, 5));
  const startTime = (await procStartTime(pid)) ?? "";
  await writeFile(l.pidFile, `${pid} ${startTime}\n`);
  cleanups.push(async () => {
    if (await sameProcessAlive(pid, startTime)) process.kill(pid, "SIGKILL");
  });
  const state = { backend: "qemu" as const, pid, start_time: startTime, sockets: l.sockets, dir: t.dir };
  return { state, pid, startTime, termMark, l };
}

const backend = () => new QemuBackend({ kvm: async () => ({ usable: false, reason: "test", ms: 0 }) });

describe("qemu stop", () => {
  it("discarding (a reset or delete: the state disk goes next): SIGKILL at once, no SIGTERM, no sync", async () => {
    const vm = await fakeVm();
    await backend().stop(vm.state, { discarding: true });
    expect(await sameProcessAlive(vm.pid, vm.startTime)).toBe(false);
    expect(existsSync(vm.termMark)).toBe(false);
    expect(existsSync(vm.l.sockets)).toBe(false);
    expect(existsSync(vm.l.pidFile)).toBe(false);
  });

  it("otherwise SIGTERM first, so QEMU closes its disks cleanly (the state disk is kept)", async () => {
    const vm = await fakeVm();
    await backend().stop(vm.state);
    expect(await sameProcessAlive(vm.pid, vm.startTime)).toBe(false);
    expect(existsSync(vm.termMark)).toBe(true);
  });
});
