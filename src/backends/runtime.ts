import { createHash } from "node:crypto";
import {
  chmod,
  chown,
  copyFile,
  mkdir,
  mkdtemp,
  open,
  readFile,
  realpath,
  rename,
  rm,
  stat,
} from "node:fs/promises";
import { basename, join, posix } from "node:path";
import { atomicWriteFile, fsyncDir } from "../util/fs.js";
import { firstLine, run, which } from "../util/run.js";

/**
 * The Node runtime injected read-only into sandboxes, so the guest agent runs on any
 * x86_64 root filesystem (Debian, Alpine/musl, distroless, even one with no libc)
 * without installing anything there: the host's own node binary, every shared library
 * it links, and the dynamic loader, started as
 * `<mount>/lib/ld-linux-x86-64.so.2 --library-path <mount>/lib <mount>/bin/node SCRIPT`.
 * Going through the loader explicitly means the guest's loader and libc (if any) are
 * never consulted, and `--library-path` is not inherited by programs the agent spawns,
 * so guest tools keep using the guest's own libraries.
 *
 * Caveat for code running on this runtime: `process.execPath` is the loader, not node
 * (it is what /proc/self/exe points to). Anything that re-executes node, such as
 * `child_process.fork`, must go through the loader too, e.g.
 * `fork(mod, args, {execPath: <loader>, execArgv: ["--library-path", <lib>, <node>]})`.
 * The guest agent does not fork node, so it needs nothing special.
 *
 * Also: glibc may dlopen NSS modules (nsswitch.conf) from the guest's own library
 * directories; on a guest with an older glibc that can mismatch. Files and DNS lookups
 * are built into glibc >= 2.34, which covers what the agent does.
 */
export interface NodeRuntime {
  /** Host path of the runtime directory (mount it read-only). */
  dir: string;
  /** Host path of the copied node binary. */
  nodeBin: string;
  /** Host path of the directory holding the loader and the libraries. */
  libDir: string;
  /** Host path of the copied dynamic loader; null when node is statically linked. */
  loader: string | null;
  /** Cache key: hash of the source node's path, size, mtime and version. */
  key: string;
  /** `process.version` of the copied node. */
  version: string;
  /** Total bytes of the copied files. */
  bytes: number;
  /**
   * The command that runs `script` with this node when the runtime directory is
   * mounted at `mountPoint` (paths as seen inside the sandbox).
   */
  argv(mountPoint: string, script: string, ...args: string[]): string[];
  /** Whether {@link nonDumpableArgv} starts a non-dumpable process (see makeExecuteOnlyLoader). */
  nonDumpable: boolean;
  /** As argv, through the execute-only loader when there is one. */
  nonDumpableArgv(mountPoint: string, script: string, ...args: string[]): string[];
}

export interface PrepareRuntimeOptions {
  /** The node binary to copy; defaults to the running one (`process.execPath`). */
  nodePath?: string;
  /** Bound for each helper process (ldd, the self-test); default 30 s. */
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** Where the backends mount the runtime inside a sandbox, by convention. */
export const RUNTIME_MOUNT = "/run/pyro/runtime";

interface Manifest {
  key: string;
  version: string;
  source: string;
  /** File name of the loader under lib/, or null for a static node. */
  loader: string | null;
  /** File name of the execute-only copy of the loader under lib/, when there is one. */
  execOnlyLoader?: string | null;
  libs: string[];
  bytes: number;
}

const MANIFEST = "manifest.json";

/**
 * Returns the runtime for the given node binary, building it under
 * `<cacheDir>/node-<key>/{bin/node,lib/*}` on first use. The build happens in a temp
 * directory renamed into place, so concurrent callers never see a partial runtime; if
 * another process wins the race, its copy is used.
 */
export async function prepareNodeRuntime(
  cacheDir: string,
  options: PrepareRuntimeOptions = {},
): Promise<NodeRuntime> {
  const source = await realpath(options.nodePath ?? process.execPath);
  const st = await stat(source);
  const version = await nodeVersion(source, options);
  const key = createHash("sha256")
    .update(JSON.stringify([source, st.size, st.mtimeMs, version, EXEC_ONLY]))
    .digest("hex")
    .slice(0, 16);
  const dir = join(cacheDir, `node-${key}`);

  const existing = await readManifest(dir);
  if (existing) return toRuntime(dir, existing);

  await mkdir(cacheDir, { recursive: true });
  const tmp = await mkdtemp(join(cacheDir, `.node-${key}-`));
  try {
    // mkdtemp makes it 0700; a sandbox running as another uid must still read it.
    await chmod(tmp, 0o755);
    const manifest = await build(tmp, source, key, version, options);
    await atomicWriteFile(join(tmp, MANIFEST), JSON.stringify(manifest, null, 2));
    await fsyncDir(tmp);
    try {
      await rename(tmp, dir);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== "EEXIST" && code !== "ENOTEMPTY") throw err;
      // Someone else finished first; theirs is as good as ours.
      const theirs = await readManifest(dir);
      if (!theirs) throw new Error(`node runtime ${dir} exists but has no ${MANIFEST}; remove it and retry`);
      await rm(tmp, { recursive: true, force: true });
      return toRuntime(dir, theirs);
    }
    await fsyncDir(cacheDir);
    return toRuntime(dir, manifest);
  } catch (err) {
    await rm(tmp, { recursive: true, force: true });
    throw err;
  }
}

/** Copies node, its libraries and the loader into `dir`, then proves the copy runs. */
async function build(
  dir: string,
  source: string,
  key: string,
  version: string,
  options: PrepareRuntimeOptions,
): Promise<Manifest> {
  const bin = join(dir, "bin");
  const lib = join(dir, "lib");
  await mkdir(bin);
  await mkdir(lib);
  let bytes = await copyDurably(source, join(bin, "node"));

  const { libs, loader } = await sharedLibraries(source, options);
  for (const l of libs) bytes += await copyDurably(await realpath(l.path), join(lib, l.name));
  const loaderName = loader ? basename(loader) : null;
  if (loader && loaderName) bytes += await copyDurably(await realpath(loader), join(lib, loaderName));
  const execOnly = loader && loaderName ? await makeExecuteOnlyLoader(join(lib, loaderName), lib) : null;
  if (execOnly) bytes += (await stat(join(lib, execOnly))).size;

  const manifest: Manifest = {
    key,
    version,
    source,
    loader: loaderName,
    execOnlyLoader: execOnly,
    libs: libs.map((l) => l.name),
    bytes,
  };
  const [cmd, ...args] = toRuntime(dir, manifest).argv(dir, "-e", "process.stdout.write(process.version)");
  // -e is an option, not a script: argv() puts it where node expects its first argument.
  const r = await run([cmd!, ...args], {
    timeoutMs: options.timeoutMs ?? 30_000,
    ...(options.signal ? { signal: options.signal } : {}),
  });
  if (r.exitCode !== 0 || r.stdout !== version) {
    throw new Error(
      `the copied node runtime does not run (${r.stdout || firstLine(r.stderr) || `exit ${r.exitCode}`})`,
    );
  }
  return manifest;
}

/** Parses `ldd` output: `name => /path (addr)` lines, plus the loader's own line. */
async function sharedLibraries(
  source: string,
  options: PrepareRuntimeOptions,
): Promise<{ libs: { name: string; path: string }[]; loader: string | null }> {
  const ldd = await which("ldd");
  if (!ldd)
    throw new Error("cannot list node's shared libraries: ldd is not installed (Debian package libc-bin)");
  const r = await run([ldd, source], {
    timeoutMs: options.timeoutMs ?? 30_000,
    ...(options.signal ? { signal: options.signal } : {}),
  });
  const text = r.stdout + r.stderr;
  if (/not a dynamic executable|statically linked/.test(text)) return { libs: [], loader: null };
  if (r.exitCode !== 0)
    throw new Error(`ldd ${source} failed: ${firstLine(r.stderr) || `exit ${r.exitCode}`}`);
  const libs: { name: string; path: string }[] = [];
  let loader: string | null = null;
  for (const line of r.stdout.split("\n").map((l) => l.trim())) {
    const mapped = /^(\S+) => (.+?)(?: \(0x[0-9a-f]+\))?$/.exec(line);
    if (mapped) {
      if (mapped[2] === "not found") throw new Error(`node needs ${mapped[1]}, which ldd cannot find`);
      libs.push({ name: mapped[1]!, path: mapped[2]! });
    } else if (/^\/\S+ \(0x[0-9a-f]+\)$/.test(line)) {
      loader = line.split(" ")[0]!;
    }
    // Anything else is the vDSO, which the kernel provides.
  }
  if (!loader) throw new Error(`ldd ${source} listed no dynamic loader`);
  // The loader is copied on its own; drop it if it was also listed as a dependency.
  const loaderName = basename(loader);
  return { libs: libs.filter((l) => l.name !== loaderName), loader };
}

/**
 * A second copy of the loader, owned by nobody and mode 0711 (`lib/ld-exec-only.so`): a
 * sandbox's root without capabilities may run it but not read it, and the kernel makes a
 * process that executes a file it cannot read non-dumpable. A command in the sandbox
 * (uid 0 too, but without CAP_SYS_PTRACE) can then neither ptrace the agent nor open its
 * /proc/PID/mem, fd or environ: bwrap's agent outlives a reset in place
 * (backends/bwrap/reset.ts) and must not carry a command's code across it. A copy, not
 * the loader itself: gVisor reads what it executes, so it starts the readable one. Only
 * when run as root (a chown needs it); null otherwise, and for a static node.
 */
const EXEC_ONLY = "exec-only-v2";
const EXEC_ONLY_LOADER = "ld-exec-only.so";
const NOBODY = 65534;

async function makeExecuteOnlyLoader(loader: string, lib: string): Promise<string | null> {
  if (process.getuid?.() !== 0) return null;
  const copy = join(lib, EXEC_ONLY_LOADER);
  await copyDurably(loader, copy);
  await chown(copy, NOBODY, NOBODY);
  await chmod(copy, 0o711);
  return EXEC_ONLY_LOADER;
}

async function copyDurably(from: string, to: string): Promise<number> {
  await copyFile(from, to);
  await chmod(to, 0o755);
  const fh = await open(to, "r");
  try {
    await fh.sync();
    return (await fh.stat()).size;
  } finally {
    await fh.close();
  }
}

async function nodeVersion(source: string, options: PrepareRuntimeOptions): Promise<string> {
  if (source === (await realpath(process.execPath))) return process.version;
  const r = await run([source, "--version"], {
    timeoutMs: options.timeoutMs ?? 30_000,
    ...(options.signal ? { signal: options.signal } : {}),
  });
  const v = r.stdout.trim();
  if (r.exitCode !== 0 || !/^v\d+\.\d+\.\d+/.test(v))
    throw new Error(`${source} --version failed: ${firstLine(r.stderr) || v || `exit ${r.exitCode}`}`);
  return v;
}

async function readManifest(dir: string): Promise<Manifest | null> {
  try {
    return JSON.parse(await readFile(join(dir, MANIFEST), "utf8")) as Manifest;
  } catch {
    return null;
  }
}

function toRuntime(dir: string, m: Manifest): NodeRuntime {
  return {
    dir,
    nodeBin: join(dir, "bin", "node"),
    libDir: join(dir, "lib"),
    loader: m.loader ? join(dir, "lib", m.loader) : null,
    key: m.key,
    version: m.version,
    bytes: m.bytes,
    nonDumpable: !!m.execOnlyLoader,
    argv(mountPoint: string, script: string, ...args: string[]): string[] {
      const node = posix.join(mountPoint, "bin", "node");
      if (!m.loader) return [node, script, ...args];
      const lib = posix.join(mountPoint, "lib");
      return [posix.join(lib, m.loader), "--library-path", lib, node, script, ...args];
    },
    nonDumpableArgv(mountPoint: string, script: string, ...args: string[]): string[] {
      const plain = this.argv(mountPoint, script, ...args);
      if (!m.execOnlyLoader) return plain;
      return [posix.join(mountPoint, "lib", m.execOnlyLoader), ...plain.slice(1)];
    },
  };
}
