import { chmod, copyFile, mkdir, symlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { QemuBackend } from "../backends/qemu/backend.js";
import { prepareVmArtifacts } from "../backends/vm/artifacts.js";
import { staticBusybox } from "../backends/vm/initramfs.js";
import { Pyro } from "../sdk/pyro.js";
import { run } from "../util/run.js";
import { type BenchRow, median, medianMs, round, row } from "./stats.js";

/**
 * qemu rows: cold boot and restore-from-template to agent ready, warm exec and agent
 * round trips, reset, each against the raw floor measured now: QEMU booting the same
 * kernel (same machine, flags and command line) into a busybox /init that powers off.
 */
export async function qemuRows(
  pyro: Pyro,
  home: string,
  quick: boolean,
  log: (s: string) => void,
  extra: Record<string, unknown>,
): Promise<BenchRow[]> {
  const backend = (await pyro.engine.loadBackend("qemu")) as QemuBackend;
  const { qemu, accel } = await backend.runtime();
  extra.qemu_accel = accel;
  // The first create builds (or finds) the kernel, disks and the template.
  log("bench: qemu: preparing the guest image and the template");
  const first = await pyro.createWorkspace({ backend: "qemu" });
  extra.qemu_template_built_ms = backend.lastStart?.template_built_ms ?? "cached";
  const spec = pyro.engine.workspaces.sandboxSpec(pyro.engine.store().getWorkspace(first.workspace_id)!);
  const artifacts = await prepareVmArtifacts(spec);
  await pyro.deleteWorkspace(first.workspace_id);

  // Floor: the same kernel to a busybox /init that powers the VM off at once.
  const floorDir = join(home, "qemu-floor");
  await mkdir(join(floorDir, "root", "bin"), { recursive: true });
  await copyFile(await staticBusybox(), join(floorDir, "root", "bin", "busybox"));
  await chmod(join(floorDir, "root", "bin", "busybox"), 0o755);
  await symlink("busybox", join(floorDir, "root", "bin", "sh"));
  await writeFile(join(floorDir, "root", "init"), "#!/bin/sh\n/bin/busybox poweroff -f\n", { mode: 0o755 });
  const cpio = join(floorDir, "floor.cpio");
  await run([
    "sh",
    "-c",
    'cd "$1" && find . | "$2" cpio -o -H newc > "$3"',
    "sh",
    join(floorDir, "root"),
    join(floorDir, "root", "bin", "busybox"),
    cpio,
  ]);
  const floorArgv = [
    qemu,
    "-M",
    "microvm,acpi=on,rtc=on",
    "-accel",
    accel,
    ...(accel === "kvm" ? ["-cpu", "host"] : []),
    "-m",
    "1024",
    "-smp",
    "1",
    "-nodefaults",
    "-no-user-config",
    "-display",
    "none",
    "-no-reboot",
    "-nic",
    "none",
    "-kernel",
    artifacts.image.kernel,
    "-initrd",
    cpio,
    "-append",
    [...artifacts.cmdline, ...(accel === "tcg" ? artifacts.tcgCmdline : [])].join(" "),
  ];
  const floor = await medianMs(quick ? 2 : 3, async () => {
    const r = await run(floorArgv, { timeoutMs: 120_000 });
    if (r.exitCode !== 0)
      throw new Error(
        `qemu floor boot failed: ${r.timedOut ? "timed out" : r.stderr || `exit ${r.exitCode}`}`,
      );
  });
  const floorName = `qemu boot to busybox /init (${accel})`;
  log(`bench: floor ${floorName} ${round(floor)} ms`);
  const rows: BenchRow[] = [];

  // Cold boot: a pyro whose qemu backend never restores.
  const coldBackend = new QemuBackend({ coldBoot: true });
  const cold = new Pyro({
    home: join(home, "cold"),
    environmentsDir: pyro.engine.paths.environmentsDir,
    backends: { qemu: coldBackend },
  });
  const coldTimes: number[] = [];
  try {
    for (let i = 0; i < (quick ? 1 : 2); i++) {
      const w = await cold.createWorkspace({ backend: "qemu" });
      coldTimes.push(coldBackend.lastStart!.answered_ms);
      await cold.deleteWorkspace(w.workspace_id);
    }
  } finally {
    await cold.close();
  }
  const coldMs = median(coldTimes);
  rows.push(row("qemu: cold boot to agent ready", coldMs, floorName, floor, {}));

  const ready: number[] = [];
  const creates: number[] = [];
  for (let i = 0; i < (quick ? 2 : 3); i++) {
    const t = performance.now();
    const w = await pyro.createWorkspace({ backend: "qemu" });
    creates.push(performance.now() - t);
    ready.push(backend.lastStart!.ready_ms);
    await pyro.deleteWorkspace(w.workspace_id);
  }
  rows.push(
    row(
      "qemu: restore to /workspace mounted (clock, entropy, seed)",
      median(ready),
      floorName,
      floor,
      {},
      `whole create ${round(median(creates))} ms`,
    ),
  );

  const ws = await pyro.createWorkspace({ backend: "qemu" });
  try {
    const ping = await medianMs(
      quick ? 10 : 40,
      () => pyro.engine.workspaces.withAgent(ws.workspace_id, "exec", (a) => a.request("ping", {})),
      3,
    );
    const exec = await medianMs(
      quick ? 5 : 20,
      async () => {
        const r = await pyro.execWorkspace(ws.workspace_id, "true");
        if (r.exit_code !== 0) throw new Error("exec failed");
      },
      3,
    );
    rows.push(
      row(
        "qemu: agent round trip (ping over virtio-serial)",
        ping,
        floorName,
        floor,
        {},
        `target ≤ 10 ms: ${ping <= 10 ? "met" : "missed"}`,
      ),
    );
    rows.push(
      row(
        "qemu: warm exec true",
        exec,
        floorName,
        floor,
        {},
        `target ≤ 10 ms: ${exec <= 10 ? "met" : "missed"}`,
      ),
    );
    const [restoreRow, resetRow] = await resetRows(
      pyro,
      ws.workspace_id,
      join(home, "restore"),
      quick,
      coldMs,
    );
    // In the order of the rows before: the restore next to the cold boot.
    rows.splice(1, 0, restoreRow);
    rows.push(resetRow);
  } finally {
    await pyro.deleteWorkspace(ws.workspace_id);
  }
  return rows;
}

/**
 * The restore from the template to agent ready, and the reset against it (issue 18: at
 * most that plus 0.2 s). The restore is measured in resets too (a create does other
 * work meanwhile, and its restores were slower and noisier), of a second workspace on a
 * backend whose setup waits for the agent's handshake: its agent-ready time is then the
 * restore alone, while a reset's setup runs beside the handshake. The two alternate.
 */
async function resetRows(
  pyro: Pyro,
  id: string,
  home: string,
  quick: boolean,
  coldMs: number,
): Promise<[BenchRow, BenchRow]> {
  const restoreBackend = new QemuBackend({ setupAfterHandshake: true });
  const restorer = new Pyro({
    home,
    environmentsDir: pyro.engine.paths.environmentsDir,
    backends: { qemu: restoreBackend },
  });
  const restore: number[] = [];
  const reset: number[] = [];
  try {
    const other = (await restorer.createWorkspace({ backend: "qemu" })).workspace_id;
    for (let i = 0; i < (quick ? 5 : 9); i++) {
      await restorer.resetWorkspace(other);
      restore.push(restoreBackend.lastStart!.answered_ms);
      // The reset alone (the exec that changes a file first is not timed).
      await pyro.execWorkspace(id, "echo x > changed.txt");
      const t = performance.now();
      await pyro.resetWorkspace(id);
      reset.push(performance.now() - t);
    }
    await restorer.deleteWorkspace(other);
  } finally {
    await restorer.close();
  }
  const restoreMs = median(restore);
  return [
    row(
      "qemu: restore from template to agent ready",
      restore,
      "cold boot to agent ready",
      coldMs,
      { max: 0.3 },
      `measured in resets; target also ≤ 1500 ms: ${restoreMs <= 1500 ? "met" : "missed"}`,
    ),
    row(
      "qemu: reset (new disk + restore)",
      reset,
      "restore from template to agent ready",
      restore,
      { maxOverFloor: 200 },
      `reset − restore ${round(median(reset) - restoreMs)} ms`,
    ),
  ];
}
