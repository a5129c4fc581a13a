import { existsSync } from "node:fs";
import { chmod, mkdir, mkdtemp, readdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { PyroError } from "../../errors.js";
import { acquireLock } from "../../util/lock.js";
import { firstLine, run, which } from "../../util/run.js";

/** The Debian metapackage that names the current cloud kernel. */
export const KERNEL_METAPACKAGE = "linux-image-cloud-amd64";

/**
 * Guest modules the initramfs loads (with their dependencies): virtio over MMIO (what
 * `-M microvm` and Firecracker expose), block disks, the serial agent channel, overlayfs
 * for the copy-on-write root, and vsock for Firecracker's agent channel.
 */
export const GUEST_MODULES = [
  "virtio_mmio",
  "virtio_blk",
  "virtio_console",
  "overlay",
  "vmw_vsock_virtio_transport",
] as const;

/** An unpacked Debian kernel package. */
export interface UnpackedKernel {
  /** Package name and version it came from (the cache key). */
  package: string;
  version: string;
  /** `uname -r` of the kernel. */
  release: string;
  dir: string;
  vmlinuz: string;
  /** Uncompressed ELF kernel, or null when it could not be extracted (no lz4 tool). */
  vmlinux: string | null;
  /** Module file paths in load order (dependencies first). */
  modules: string[];
}

interface KernelManifest {
  package: string;
  version: string;
  release: string;
  vmlinux: boolean;
  modules: string[];
}

/**
 * The Debian cloud kernel, fetched with `apt-get download` and unpacked with `dpkg -x`
 * (never installed on the host), cached under `<cacheDir>/kernel-<version>/`. Once a
 * kernel is cached it is used as is (asking apt which version is current costs seconds);
 * `refresh` asks apt again and fetches a newer kernel if there is one.
 */
export async function prepareKernel(
  cacheDir: string,
  options: { signal?: AbortSignal; onProgress?: (line: string) => void; refresh?: boolean } = {},
): Promise<UnpackedKernel> {
  if (!options.refresh) {
    const cachedDirs = (await readdir(cacheDir).catch(() => [] as string[]))
      .filter((d) => d.startsWith("kernel-") && !d.endsWith(".lock"))
      .sort();
    for (const d of cachedDirs.reverse()) {
      const m = await readManifest(join(cacheDir, d));
      if (m) return toKernel(join(cacheDir, d), m);
    }
  }
  const { pkg, version } = await resolveKernelPackage(options.signal);
  const dir = join(cacheDir, `kernel-${version}`);
  const cached = await readManifest(dir);
  if (cached) return toKernel(dir, cached);
  await mkdir(cacheDir, { recursive: true });
  const release = await acquireLock(join(cacheDir, `kernel-${version}.lock`), {
    ...(options.signal ? { signal: options.signal } : {}),
  });
  try {
    const again = await readManifest(dir);
    if (again) return toKernel(dir, again);
    options.onProgress?.(`fetching ${pkg} ${version}`);
    const tmp = await mkdtemp(join(cacheDir, ".kernel-"));
    try {
      // mkdtemp makes it 0700; QEMU run by another user of a shared cache must read it.
      await chmod(tmp, 0o755);
      const manifest = await unpack(tmp, pkg, version, options.signal);
      await writeFile(join(tmp, "manifest.json"), `${JSON.stringify(manifest, null, 2)}\n`);
      await rm(dir, { recursive: true, force: true });
      await rename(tmp, dir);
      return toKernel(dir, manifest);
    } catch (err) {
      await rm(tmp, { recursive: true, force: true });
      throw err;
    }
  } finally {
    await release();
  }
}

/** The versioned kernel package the metapackage depends on, and its version. */
async function resolveKernelPackage(signal?: AbortSignal): Promise<{ pkg: string; version: string }> {
  const opts = { timeoutMs: 30_000, ...(signal ? { signal } : {}) };
  const dep = await run(["apt-cache", "depends", KERNEL_METAPACKAGE], opts);
  const pkg = /Depends:\s*(linux-image-\S+)/.exec(dep.stdout)?.[1];
  if (dep.exitCode !== 0 || !pkg) {
    throw new PyroError(
      "backend_unavailable",
      `cannot find the guest kernel package ${KERNEL_METAPACKAGE} (${firstLine(dep.stderr) || "apt knows no such package"})`,
      "run `apt-get update` (Debian 12 hosts), or `npm run setup`",
    );
  }
  const show = await run(["apt-cache", "show", "--no-all-versions", pkg], opts);
  const version = /^Version:\s*(\S+)/m.exec(show.stdout)?.[1];
  if (!version) throw new PyroError("backend_unavailable", `apt-cache shows no version of ${pkg}`);
  return { pkg, version };
}

async function unpack(
  tmp: string,
  pkg: string,
  version: string,
  signal?: AbortSignal,
): Promise<KernelManifest> {
  const opts = { cwd: tmp, timeoutMs: 10 * 60_000, ...(signal ? { signal } : {}) };
  // The download runs as the caller: apt's `_apt` sandbox user could not write here.
  const dl = await run(
    ["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", `${pkg}=${version}`],
    opts,
  );
  const deb = (await readdir(tmp)).find((f) => f.endsWith(".deb"));
  if (dl.exitCode !== 0 || !deb) {
    throw new PyroError(
      "backend_unavailable",
      `apt-get download ${pkg} failed: ${firstLine(dl.stderr) || `exit ${dl.exitCode}`}`,
      "the Debian archive must be reachable (PYRO_DEBIAN_MIRROR or the host's apt sources)",
    );
  }
  const root = join(tmp, "root");
  const x = await run(["dpkg-deb", "-x", join(tmp, deb), root], opts);
  if (x.exitCode !== 0) throw new PyroError("internal", `dpkg-deb -x ${deb}: ${firstLine(x.stderr)}`);
  await rm(join(tmp, deb));

  const boot = await readdir(join(root, "boot"));
  const vmlinuzName = boot.find((f) => f.startsWith("vmlinuz-"));
  if (!vmlinuzName) throw new PyroError("internal", `${pkg} has no /boot/vmlinuz-*`);
  const release = vmlinuzName.slice("vmlinuz-".length);
  await rename(join(root, "boot", vmlinuzName), join(tmp, "vmlinuz"));

  const modRoot = join(root, "lib", "modules", release);
  const index = await indexModules(modRoot);
  const order = moduleLoadOrder(GUEST_MODULES, (m) => index.get(m)?.depends ?? null);
  await mkdir(join(tmp, "modules"));
  for (const m of order) await rename(index.get(m)!.path, join(tmp, "modules", `${m}.ko`));
  await rm(root, { recursive: true, force: true });

  const vmlinux = await extractVmlinux(join(tmp, "vmlinuz"), join(tmp, "vmlinux"), signal);
  return { package: pkg, version, release, vmlinux, modules: order.map((m) => `${m}.ko`) };
}

/**
 * Module paths under `dir` by name, with the `depends=` lists of `wanted` and everything
 * they pull in (only those .ko files are read).
 */
async function indexModules(dir: string): Promise<Map<string, { path: string; depends: string[] | null }>> {
  const out = new Map<string, { path: string; depends: string[] | null }>();
  const walk = async (d: string): Promise<void> => {
    for (const e of await readdir(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) await walk(p);
      else if (e.name.endsWith(".ko"))
        out.set(e.name.slice(0, -3).replace(/-/g, "_"), { path: p, depends: null });
    }
  };
  await walk(dir);
  const queue: string[] = [...GUEST_MODULES];
  for (let name = queue.shift(); name !== undefined; name = queue.shift()) {
    const m = out.get(name);
    if (!m || m.depends) continue;
    m.depends = modinfoDepends(await readFile(m.path));
    queue.push(...m.depends);
  }
  return out;
}

/** The `depends=` field of a module's .modinfo section (NUL-separated key=value strings). */
export function modinfoDepends(ko: Buffer): string[] {
  const marker = Buffer.from("\0depends=");
  const at = ko.indexOf(marker);
  if (at < 0) return [];
  const start = at + marker.length;
  const end = ko.indexOf(0, start);
  const value = ko.subarray(start, end < 0 ? undefined : end).toString("latin1");
  return value === "" ? [] : value.split(",").map((s) => s.replace(/-/g, "_"));
}

/**
 * Load order for `wanted` and everything they depend on: dependencies before dependents,
 * each module once. `depends(name)` returns null for a module that does not exist.
 */
export function moduleLoadOrder(
  wanted: readonly string[],
  depends: (name: string) => string[] | null,
): string[] {
  const order: string[] = [];
  const state = new Map<string, "visiting" | "done">();
  const visit = (m: string, chain: string[]): void => {
    const s = state.get(m);
    if (s === "done") return;
    if (s === "visiting")
      throw new PyroError("internal", `module dependency cycle: ${[...chain, m].join(" -> ")}`);
    const deps = depends(m);
    if (deps === null)
      throw new PyroError(
        "internal",
        `the guest kernel has no module ${m} (${chain.join(" -> ") || "wanted"})`,
      );
    state.set(m, "visiting");
    for (const d of deps) visit(d, [...chain, m]);
    state.set(m, "done");
    order.push(m);
  };
  for (const m of wanted) visit(m, []);
  return order;
}

/**
 * The ELF kernel inside a bzImage (Firecracker boots only that): the payload is the
 * compressed stream that starts at the compressor's magic; Debian's cloud kernel uses LZ4
 * (legacy frame). Returns false when the `lz4` tool is missing.
 */
async function extractVmlinux(vmlinuz: string, out: string, signal?: AbortSignal): Promise<boolean> {
  const lz4 = await which("lz4");
  if (!lz4) return false;
  const data = await readFile(vmlinuz);
  const magic = Buffer.from([0x02, 0x21, 0x4c, 0x18]);
  for (let at = data.indexOf(magic); at >= 0; at = data.indexOf(magic, at + 1)) {
    const part = `${out}.lz4`;
    await writeFile(part, data.subarray(at));
    // lz4 stops at the end of the frame and complains about the trailing bytes; the ELF
    // check below decides.
    await run([lz4, "-dqf", part, out], { timeoutMs: 60_000, ...(signal ? { signal } : {}) });
    await rm(part, { force: true });
    const head = existsSync(out) ? (await readFile(out)).subarray(0, 4) : Buffer.alloc(0);
    if (head.equals(Buffer.from([0x7f, 0x45, 0x4c, 0x46]))) return true;
    await rm(out, { force: true });
  }
  return false;
}

async function readManifest(dir: string): Promise<KernelManifest | null> {
  try {
    return JSON.parse(await readFile(join(dir, "manifest.json"), "utf8")) as KernelManifest;
  } catch {
    return null;
  }
}

function toKernel(dir: string, m: KernelManifest): UnpackedKernel {
  return {
    package: m.package,
    version: m.version,
    release: m.release,
    dir,
    vmlinuz: join(dir, "vmlinuz"),
    vmlinux: m.vmlinux ? join(dir, "vmlinux") : null,
    modules: m.modules.map((f) => join(dir, "modules", f)),
  };
}
