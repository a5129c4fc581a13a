import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { BackendName } from "../backends/backend.js";
import { ensureDiskImage } from "../backends/disk-image.js";
import { Pyro } from "../sdk/pyro.js";
import { run } from "../util/run.js";
import { backendRows, bareBwrap } from "./backend-rows.js";
import { cliRows } from "./cli.js";
import { commitRows } from "./commit.js";
import { environmentRows } from "./environments.js";
import { mcpRows } from "./mcp.js";
import { networkRows } from "./network.js";
import { qemuRows } from "./qemu.js";
import { serviceRows } from "./services.js";
import { shellRows } from "./shells.js";
import { type BenchRow, median, medianMs, missedRows, printTable, round, row, sampleMs } from "./stats.js";
import { syncRows } from "./sync.js";

/**
 * `npm run bench`: every capability against a raw floor measured in the same run, as a
 * ratio (machines differ; ratios measured together travel), with the goal an issue names
 * beside it (GOALS in backend-rows.ts, issue 18). Prints a table, and the rows as JSON
 * with --json. --check: exits 1 when a row misses its goal by more than the noise of its
 * samples (stats.ts judge()). --quick: fewer runs. --only=GROUP runs one group of rows:
 * cli (the CLI as whole processes), network (the egress proxy), services, shells, commit,
 * environments (image pull and create from an image), mcp, sync (reset, sync push and
 * export of a 10k-file / 100 MB workspace), bwrap (the bwrap backend's rows: create, warm
 * exec, reset, idle RSS, one-shot run), docker (the docker backend's rows against
 * `docker run --rm` of the same image), gvisor (the same against `runsc do true`), qemu
 * (cold boot, restore, exec and reset against a bare boot of the same kernel; the reset
 * against the restore measured in the run).
 */
async function main(): Promise<void> {
  const json = process.argv.includes("--json");
  const quick = process.argv.includes("--quick");
  const log = (s: string) => process.stderr.write(`${s}\n`);
  if (process.argv.includes("--only=cli")) {
    const home = await mkdtemp(join(tmpdir(), "pyro-bench-"));
    try {
      const rootfs = (await new Pyro({ home }).pullEnvironment("debian:12")).rootfs;
      return output(await cliRows({ quick, home, bwrapTrue: bareBwrap(rootfs), log }), {}, json);
    } finally {
      await rm(home, { recursive: true, force: true });
    }
  }
  if (process.argv.includes("--only=sync")) {
    const home = await mkdtemp(join(tmpdir(), "pyro-bench-"));
    const pyro = new Pyro({ home });
    try {
      await pyro.pullEnvironment("debian:12");
      return output(await syncRows({ pyro, quick, log }), {}, json);
    } finally {
      await pyro.close();
      await rm(home, { recursive: true, force: true });
    }
  }
  if (process.argv.includes("--only=services")) return output(await serviceRows({ quick, log }), {}, json);
  if (process.argv.includes("--only=shells")) return output(await shellRows({ quick, log }), {}, json);
  if (process.argv.includes("--only=mcp")) return output(await mcpRows({ quick, log }), {}, json);
  if (process.argv.includes("--only=commit")) return output(await commitRows({ quick, log }), {}, json);
  if (process.argv.includes("--only=environments"))
    return output(await environmentRows({ quick, log }), {}, json);
  if (process.argv.includes("--only=network")) {
    const extra: Record<string, unknown> = {};
    const rows = await networkRows({ quick, log, extra });
    return output(rows, extra, json);
  }
  const home = await mkdtemp(join(tmpdir(), "pyro-bench-"));
  const pyro = new Pyro({ home });
  const rows: BenchRow[] = [];
  const extra: Record<string, unknown> = {};
  const n = quick ? 5 : 20;
  try {
    if (process.argv.includes("--only=docker")) {
      log("bench: pulling debian:12");
      await pyro.pullEnvironment("debian:12");
      rows.push(...(await otherBackendRows(pyro, home, ["docker"], { n, quick, extra, log })));
      return output(rows, extra, json);
    }
    if (process.argv.includes("--only=gvisor")) {
      log("bench: pulling debian:12");
      await pyro.pullEnvironment("debian:12");
      rows.push(...(await otherBackendRows(pyro, home, ["gvisor"], { n, quick, extra, log })));
      return output(rows, extra, json);
    }
    if (process.argv.includes("--only=qemu")) {
      log("bench: pulling debian:12");
      await pyro.pullEnvironment("debian:12");
      const why = await unavailable(pyro, "qemu");
      if (why) log(`bench: qemu skipped: ${why}`);
      else rows.push(...(await qemuRows(pyro, home, quick, log, extra)));
      return output(rows, extra, json);
    }
    const { bwrapTrue, floor, floorRun } = await bwrapFloor(pyro, n, log);
    rows.push(...(await backendRows(pyro, "bwrap", "bwrap /bin/true", floor, n, quick, extra, floorRun)));
    if (process.argv.includes("--only=bwrap")) return output(rows, extra, json);

    // The disk limit's share of a create: a sparse 10 GiB ext4 image (the mount is in the launch).
    const diskDir = await mkdtemp(join(home, "disk-"));
    let k = 0;
    // As a create makes it: a sparse copy of the blank image kept in the cache (made here first).
    await ensureDiskImage(join(diskDir, "warm.img"), 10 * 1024, join(diskDir, "templates"));
    const diskMs = await medianMs(n, () =>
      ensureDiskImage(join(diskDir, `d${k++}.img`), 10 * 1024, join(diskDir, "templates")),
    );
    await rm(diskDir, { recursive: true, force: true });
    rows.push(
      row(
        "bwrap/gvisor: disk image made (copy of a blank 10 GiB sparse ext4)",
        diskMs,
        "bwrap /bin/true",
        floor,
        {},
      ),
    );

    // The other backends, each against its own raw floor measured now.
    rows.push(...(await otherBackendRows(pyro, home, ["gvisor", "docker"], { n, quick, extra, log })));

    const qemuWhy = await unavailable(pyro, "qemu");
    if (qemuWhy) {
      log(`bench: qemu skipped: ${qemuWhy}`);
      extra.qemu_skipped = qemuWhy;
    } else {
      rows.push(...(await qemuRows(pyro, home, quick, log, extra)));
    }
    rows.push(...(await syncRows({ pyro, quick, log })));

    log("bench: egress proxy");
    rows.push(...(await networkRows({ quick, log, extra })));
    log("bench: services");
    rows.push(...(await serviceRows({ quick, log })));
    log("bench: shells");
    rows.push(...(await shellRows({ quick, log })));
    log("bench: mcp");
    rows.push(...(await mcpRows({ quick, log })));
    log("bench: workspace commit");
    rows.push(...(await commitRows({ quick, log })));
    rows.push(...(await environmentRows({ quick, log })));
    rows.push(...(await cliRows({ quick, home, bwrapTrue, log })));
  } finally {
    await pyro.close();
    await rm(home, { recursive: true, force: true });
  }
  output(rows, extra, json);
}

function output(rows: BenchRow[], extra: Record<string, unknown>, json: boolean): void {
  if (json) process.stdout.write(`${JSON.stringify({ rows, ...extra }, null, 2)}\n`);
  else process.stdout.write(`${printTable(rows)}\n`);
  if (!process.argv.includes("--check")) return;
  // --check: the verdict on stderr (stdout stays the table or the JSON).
  const missed = missedRows(rows);
  const withGoal = rows.filter((r) => r.pass !== null).length;
  if (missed.length === 0) {
    process.stderr.write(`bench --check: every row with a goal (${withGoal}) meets it within its noise\n`);
    return;
  }
  process.stderr.write(`bench --check: ${missed.length} of ${withGoal} rows miss their goal beyond noise:\n`);
  for (const r of missed)
    process.stderr.write(
      `  ${r.name}: ${r.value_ms} ${r.unit} (ratio ${r.ratio}×, IQR ${r.iqr[0]} / floor IQR ${r.iqr[1]}), goal ${r.target}\n`,
    );
  process.exitCode = 1;
}

/** The floor of the bwrap rows: a bare bwrap spawn of /bin/true over debian:12's rootfs. */
async function bwrapFloor(pyro: Pyro, n: number, log: (s: string) => void) {
  log("bench: pulling debian:12");
  const env = await pyro.pullEnvironment("debian:12");
  const bwrapTrue = bareBwrap(env.rootfs);
  const floorRun = async () => {
    const r = await run(bwrapTrue, { killGroup: false });
    if (r.exitCode !== 0) throw new Error(`bwrap floor failed: ${r.stderr}`);
  };
  const floor = await sampleMs(n, floorRun);
  log(`bench: floor bwrap /bin/true ${round(median(floor))} ms`);
  return { bwrapTrue, floor, floorRun };
}

/** The rows of gVisor and docker (as asked), each against its own raw floor measured now. */
async function otherBackendRows(
  pyro: Pyro,
  home: string,
  names: BackendName[],
  opts: { n: number; quick: boolean; extra: Record<string, unknown>; log: (s: string) => void },
): Promise<BenchRow[]> {
  const { n, quick, extra, log } = opts;
  const rows: BenchRow[] = [];
  const others: { name: BackendName; floorName: string; floorArgv: string[] }[] = [
    {
      name: "gvisor",
      floorName: "runsc do true",
      floorArgv: [
        "runsc",
        `--root=${join(home, "runsc-floor")}`,
        "--network=none",
        "--platform=ptrace",
        "do",
        "/bin/true",
      ],
    },
    {
      name: "docker",
      floorName: "docker run --rm true",
      floorArgv: ["docker", "run", "--rm", "--network", "none", "pyro-bench-floor", "/bin/true"],
    },
  ];
  for (const o of others.filter((x) => names.includes(x.name))) {
    const why = await unavailable(pyro, o.name);
    if (why) {
      log(`bench: ${o.name} skipped: ${why}`);
      extra[`${o.name}_skipped`] = why;
      continue;
    }
    if (o.name === "docker") {
      // The floor's image: the same environment, imported by the backend's first create.
      // Its own container's image: the newest pyro-env image may be another environment's.
      const w = await pyro.createWorkspace({ backend: "docker" });
      const img = await run(["docker", "inspect", "--format", "{{.Config.Image}}", `pyro-${w.workspace_id}`]);
      await pyro.deleteWorkspace(w.workspace_id);
      if (img.exitCode !== 0 || !img.stdout.trim()) throw new Error(`docker inspect failed: ${img.stderr}`);
      await run(["docker", "tag", img.stdout.trim(), "pyro-bench-floor"]);
    }
    const f = await sampleMs(quick ? 3 : 10, async () => {
      const r = await run(o.floorArgv, { killGroup: false });
      if (r.exitCode !== 0) throw new Error(`${o.floorName} failed: ${r.stderr}`);
    });
    log(`bench: floor ${o.floorName} ${round(median(f))} ms`);
    rows.push(...(await backendRows(pyro, o.name, o.floorName, f, n, quick, extra)));
  }
  return rows;
}

/** Why a backend cannot be benchmarked here, or null. */
async function unavailable(pyro: Pyro, backend: BackendName): Promise<string | null> {
  if (!pyro.engine.implemented().includes(backend)) return "not implemented in this build";
  try {
    await pyro.engine.chooseBackend(backend, false);
    return null;
  } catch (err) {
    return (err as Error).message;
  }
}

main().catch((err) => {
  process.stderr.write(`bench failed: ${(err as Error).stack ?? err}\n`);
  process.exitCode = 1;
});
