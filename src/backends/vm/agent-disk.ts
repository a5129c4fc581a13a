import { createHash, type Hash } from "node:crypto";
import { cp, link, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { dirname, join, relative } from "node:path";
import { touch } from "../../util/fs.js";
import { agentArgv } from "../guest.js";
import type { NodeRuntime } from "../runtime.js";
import { mkfsExt4 } from "./disks.js";
import { AGENT_VSOCK_PORT, DISK_SERIAL, GUEST, NET_VSOCK_PORT, SETUP_HELPER } from "./types.js";

/** npm packages the guest agent imports (the rest of node_modules stays on the host). */
export const AGENT_PACKAGES = ["zod", "tar", "diff", "ignore", "node-pty"] as const;

/**
 * Parts of a package the guest never loads, left off the agent disk: node-pty ships
 * prebuilt addons for other platforms (58 MB) and its C++ sources; the guest loads its
 * lib/ and the addon setup built here (build/Release).
 */
const SKIPPED_PARTS: Record<string, readonly string[]> = {
  "node-pty": [
    "prebuilds",
    "deps",
    "third_party",
    "src",
    "scripts",
    "node-addon-api",
    "build/Release/obj.target",
    "build/Release/.deps",
  ],
};

/** The files of a package that matter to its identity beyond its package.json: a built addon. */
const NATIVE_FILES: Record<string, readonly string[]> = {
  "node-pty": ["build/Release/pty.node"],
};

/** Name prefix of the virtio-serial ports that carry agent connections. */
export const SERIAL_PORT_PREFIX = "pyro.agent.";

/** Name of the virtio-serial port of the network mux (agent/netmux.ts). */
export const NET_PORT_NAME = "pyro.net";

/**
 * Name of the virtio-serial port of the setup helper's server (setup-helper.ts): the
 * qemu backend sends a restored VM's setup request there itself (qemu/setup-port.ts).
 */
export const SETUP_PORT_NAME = "pyro.setup";

/**
 * Stage 2, PID 1 after switch_root (busybox from the agent disk): the rest of the
 * system setup, the setup helper's server (when the disk has the helper: it is running,
 * waiting, in the template every clone restores; on the serial channel it also serves its
 * own port, SETUP_PORT_NAME), then the agent, each restarted if it
 * ever exits, with the shell reaping orphans while it waits. The channel comes from the
 * kernel command line.
 */
export function stage2Script(
  agentArgv: string[],
  bridge: string | null,
  setupHelper: string | null = null,
): string {
  const q = (s: string) => `'${s.replace(/'/g, "'\\''")}'`;
  const B = `${GUEST.agentDir}/bin/busybox`;
  return `#!${B} sh
B=${B}
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
$B mkdir -p /dev/pts /dev/shm
$B mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /dev/pts
$B ln -sf pts/ptmx /dev/ptmx
$B mount -t tmpfs -o nosuid,nodev tmpfs /dev/shm
$B hostname pyro
$B ip link set lo up 2>/dev/null
# Dirty pages reach the state disk within a second (the host may stop the VM any time).
echo 100 > /proc/sys/vm/dirty_expire_centisecs
echo 100 > /proc/sys/vm/dirty_writeback_centisecs
channel=serial
for a in $($B cat /proc/cmdline); do
  case "$a" in pyro.channel=*) channel="\${a#pyro.channel=}" ;; esac
done
keep() { while :; do "$@"; echo "pyro-init: $1 exited $?, restarting"; $B sleep 1; done; }
${
  setupHelper
    ? `setup_port=${SETUP_PORT_NAME}
[ "$channel" = vsock ] && setup_port=
keep ${[setupHelper, ...setupServerArgs()].map(q).join(" ")} $setup_port &
`
    : ""
}if [ "$channel" = vsock ]; then
  ${bridge ? `keep ${q(bridge)} ${AGENT_VSOCK_PORT} ${GUEST.agentSocket} &` : 'echo "pyro-init: no vsock bridge on the agent disk"; $B poweroff -f'}
  ${bridge ? `keep ${q(bridge)} ${NET_VSOCK_PORT} ${GUEST.netSocket} &` : ""}
  keep ${agentArgv.map(q).join(" ")} --listen ${GUEST.agentSocket} --net-listen ${GUEST.netSocket} &
else
  keep ${agentArgv.map(q).join(" ")} --serial ${SERIAL_PORT_PREFIX} --net-mux ${NET_PORT_NAME} &
fi
wait $!
`;
}

/** The setup helper's server arguments (backends/vm/setup-helper.ts): its socket and the guest's layout. */
export function setupServerArgs(): string[] {
  return [
    "--serve",
    GUEST.setupSocket,
    DISK_SERIAL.seed,
    GUEST.seedDir,
    GUEST.workspaceUpper,
    GUEST.workspaceWork,
    GUEST.workspace,
  ];
}

/**
 * Hashes the contents of a tree into `h` (paths and bytes, not times: a fresh checkout of
 * the same sources gives the same agent disk, so CI reuses its cached VM template).
 */
async function hashTree(h: Hash, root: string, rel: string): Promise<void> {
  const files: string[] = [];
  const walk = async (d: string): Promise<void> => {
    for (const e of await readdir(d, { withFileTypes: true }).catch(() => [])) {
      const p = join(d, e.name);
      if (e.isDirectory()) await walk(p);
      else if (e.isFile()) files.push(p);
    }
  };
  await walk(join(root, rel));
  for (const f of files.sort()) h.update(`${relative(root, f)}\0`).update(await readFile(f));
}

/** The agent's npm packages and their dependencies, read from package.json files. */
export async function packageClosure(appDir: string, roots: readonly string[]): Promise<string[]> {
  const seen = new Set<string>();
  const queue = [...roots];
  for (let name = queue.shift(); name !== undefined; name = queue.shift()) {
    if (seen.has(name)) continue;
    seen.add(name);
    const pkg = JSON.parse(await readFile(join(appDir, "node_modules", name, "package.json"), "utf8")) as {
      dependencies?: Record<string, string>;
    };
    queue.push(...Object.keys(pkg.dependencies ?? {}));
  }
  return [...seen].sort();
}

export interface AgentDiskInputs {
  appDir: string;
  runtime: NodeRuntime;
  busybox: string;
  /** Static vsock→unix bridge for Firecracker guests, when one could be built. */
  bridge: string | null;
  /** Static setup helper run after every start (bin/pyro-vmsetup, setup-helper.ts), when one could be built. */
  setupHelper: string | null;
}

/**
 * The agent disk: the Node runtime, the built pyro agent with the packages it imports,
 * busybox and stage 2, as a read-only ext4 image cached by a hash of its inputs.
 */
export async function prepareAgentDisk(
  cacheDir: string,
  inputs: AgentDiskInputs,
  signal?: AbortSignal,
): Promise<string> {
  const packages = await packageClosure(inputs.appDir, AGENT_PACKAGES);
  const argvOfAgent = agentArgv(
    inputs.runtime,
    { runtime: `${GUEST.agentDir}/runtime`, app: `${GUEST.agentDir}/app` },
    GUEST.workspace,
    { vm: GUEST.agentDir },
  );
  const script = stage2Script(
    argvOfAgent,
    inputs.bridge ? `${GUEST.agentDir}/bin/pyro-vsock-bridge` : null,
    inputs.setupHelper ? `${GUEST.agentDir}/bin/${SETUP_HELPER}` : null,
  );
  const h = createHash("sha256").update(JSON.stringify([inputs.runtime.key, script, packages]));
  await hashTree(h, inputs.appDir, "dist");
  // Packages by name and version: hashing their contents costs seconds (zod alone is thousands of files).
  for (const p of packages) {
    h.update(await readFile(join(inputs.appDir, "node_modules", p, "package.json")));
    // A native addon is built on this host: a rebuild must make a new disk.
    for (const f of NATIVE_FILES[p] ?? [])
      h.update(await readFile(join(inputs.appDir, "node_modules", p, f)));
  }
  for (const f of [inputs.busybox, inputs.bridge, inputs.setupHelper]) h.update(f ? await readFile(f) : "-");
  const key = h.digest("hex").slice(0, 16);
  const out = join(cacheDir, `agent-${key}.ext4`);
  // Touched on every use: agent disks idle for a day are removed when a new one is built.
  if (await touch(out)) return out;

  await mkdir(cacheDir, { recursive: true });
  const stage = await mkdtemp(join(cacheDir, ".agent-"));
  try {
    await mkdir(join(stage, "bin"));
    await cp(inputs.busybox, join(stage, "bin", "busybox"));
    if (inputs.bridge) await cp(inputs.bridge, join(stage, "bin", "pyro-vsock-bridge"));
    if (inputs.setupHelper) await cp(inputs.setupHelper, join(stage, "bin", SETUP_HELPER));
    await linkOrCopy(inputs.runtime.dir, join(stage, "runtime"));
    await mkdir(join(stage, "app", "node_modules"), { recursive: true });
    await writeFile(join(stage, "app", "package.json"), '{"type":"module"}\n');
    await cp(join(inputs.appDir, "dist"), join(stage, "app", "dist"), { recursive: true });
    for (const p of packages) {
      await mkdir(dirname(join(stage, "app", "node_modules", p)), { recursive: true });
      const from = join(inputs.appDir, "node_modules", p);
      const skipped = new Set((SKIPPED_PARTS[p] ?? []).map((part) => join(from, part)));
      await cp(from, join(stage, "app", "node_modules", p), {
        recursive: true,
        dereference: true,
        filter: (src) => !skipped.has(src),
      });
    }
    await writeFile(join(stage, "stage2.sh"), script, { mode: 0o755 });
    await mkfsExt4(out, { dir: stage, label: "pyro-agent", readOnly: true, ...(signal ? { signal } : {}) });
    for (const f of await readdir(cacheDir)) {
      if (!/^agent-[0-9a-f]{16}\.ext4$/.test(f) || join(cacheDir, f) === out) continue;
      const st = await stat(join(cacheDir, f)).catch(() => null);
      if (st && Date.now() - st.mtimeMs > 24 * 3600 * 1000) await rm(join(cacheDir, f), { force: true });
    }
    return out;
  } finally {
    await rm(stage, { recursive: true, force: true });
  }
}

/** Hard-links a tree into place (same filesystem: instant), copying where links fail. */
async function linkOrCopy(from: string, to: string): Promise<void> {
  await mkdir(to, { recursive: true });
  for (const e of await readdir(from, { withFileTypes: true })) {
    const a = join(from, e.name);
    const b = join(to, e.name);
    if (e.isDirectory()) await linkOrCopy(a, b);
    else await link(a, b).catch(() => cp(a, b));
  }
}
