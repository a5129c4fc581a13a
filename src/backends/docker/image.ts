/**
 * Environments as Docker images, without a registry: the cached root filesystem is
 * streamed through GNU tar into the engine's import endpoint (`docker import`), once per
 * environment and engine, under a lock so two processes never import the same one.
 */
import { spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { mkdir, readFile, realpath, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import type Docker from "dockerode";
import { PyroError } from "../../errors.js";
import { acquireLock } from "../../util/lock.js";
import { deadline, engineError, ignoreGone } from "./client.js";

export const IMAGE_REPO = "pyro-env";
/** Label on every image pyro imports, so they can be listed and pruned. */
export const LABEL_ROOTFS = "dev.pyro.rootfs";
const IMPORT_MS = 30 * 60_000;

/**
 * `pyro-env:<hash>` where the hash covers the rootfs's real path and its cache entry's
 * manifest (which names the recipe and the build time): a rebuilt environment gets a new
 * image, the same one is found again. Without a manifest the directory's identity stands in.
 */
export async function imageRef(rootfs: string): Promise<string> {
  const real = await realpath(rootfs).catch(() => {
    throw new PyroError("environment_not_found", `the environment's root filesystem ${rootfs} is missing`);
  });
  let identity: string;
  try {
    identity = await readFile(join(dirname(real), "manifest.json"), "utf8");
  } catch {
    const st = await stat(real);
    identity = JSON.stringify([st.dev, st.ino, st.mtimeMs, st.ctimeMs]);
  }
  const hash = createHash("sha256").update(real).update("\0").update(identity).digest("hex").slice(0, 20);
  return `${IMAGE_REPO}:${hash}`;
}

/** True when the engine has an image by that reference. */
export async function imageExists(docker: Docker, ref: string, signal?: AbortSignal): Promise<boolean> {
  return (
    (await ignoreGone(
      docker.getImage(ref).inspect(deadline(undefined, signal) as Docker.ImageInspectOptions),
    )) !== undefined
  );
}

/**
 * Makes sure the environment's image exists on the engine and returns its reference.
 * The lock lives next to the environment cache's own locks (shared by every process
 * that uses that cache), falling back to the temp directory.
 */
export async function ensureImage(
  docker: Docker,
  endpoint: string,
  rootfs: string,
  options: { signal?: AbortSignal } = {},
): Promise<string> {
  const ref = await imageRef(rootfs);
  try {
    if (await imageExists(docker, ref, options.signal)) return ref;
  } catch (err) {
    throw engineError(err, `inspecting image ${ref}`, endpoint);
  }
  const key = createHash("sha256").update(endpoint).update("\0").update(ref).digest("hex").slice(0, 16);
  const release = await acquireLock(join(await lockDir(rootfs), `docker-import-${key}.lock`), {
    timeoutMs: IMPORT_MS,
    ...(options.signal ? { signal: options.signal } : {}),
  });
  try {
    // Someone else may have imported it while we waited.
    if (await imageExists(docker, ref, options.signal)) return ref;
    await importRootfs(docker, rootfs, ref, options.signal);
    return ref;
  } catch (err) {
    throw engineError(err, `importing ${rootfs} as image ${ref}`, endpoint);
  } finally {
    await release();
  }
}

async function lockDir(rootfs: string): Promise<string> {
  const candidate = join(dirname(dirname(rootfs)), ".locks");
  try {
    await mkdir(candidate, { recursive: true });
    return candidate;
  } catch {
    return tmpdir();
  }
}

/**
 * Streams `tar -C rootfs -c .` into the engine under a temporary tag and moves the tag to
 * `ref` only once tar succeeded and the engine reported no error: a failed or cut-off
 * import never shows up under the real name.
 */
async function importRootfs(
  docker: Docker,
  rootfs: string,
  ref: string,
  signal?: AbortSignal,
): Promise<void> {
  const [, tag] = ref.split(":") as [string, string];
  const tmpTag = `importing-${randomBytes(6).toString("hex")}`;
  const tmpRef = `${IMAGE_REPO}:${tmpTag}`;
  const tar = spawn("tar", ["-C", rootfs, "--numeric-owner", "--one-file-system", "-cf", "-", "."], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let tarErr = "";
  tar.stderr.on("data", (c: Buffer) => {
    if (tarErr.length < 4096) tarErr += c.toString("utf8");
  });
  const tarDone = new Promise<number>((resolve, reject) => {
    tar.once("error", (e) =>
      reject(
        new PyroError("backend_unavailable", `cannot run GNU tar to export the environment: ${e.message}`),
      ),
    );
    tar.once("close", (code) => resolve(code ?? 1));
  });
  try {
    const response = await docker.importImage(tar.stdout, {
      repo: IMAGE_REPO,
      tag: tmpTag,
      changes: [`LABEL ${LABEL_ROOTFS}=${JSON.stringify(rootfs)}`],
      ...deadline(IMPORT_MS, signal),
    } as object);
    const events = await new Promise<{ error?: string; errorDetail?: { message?: string } }[]>(
      (resolve, reject) =>
        docker.modem.followProgress(response, (err, out) => (err ? reject(err) : resolve(out))),
    );
    const code = await tarDone;
    const failed = events.find((e) => e.error || e.errorDetail);
    if (failed)
      throw new PyroError(
        "backend_unavailable",
        `the engine refused the import: ${failed.error ?? failed.errorDetail?.message}`,
      );
    if (code !== 0)
      throw new PyroError("backend_unavailable", `tar of ${rootfs} failed (exit ${code}): ${tarErr.trim()}`);
    await docker.getImage(tmpRef).tag({ repo: IMAGE_REPO, tag, ...deadline(undefined, signal) });
  } catch (err) {
    tar.kill("SIGKILL");
    throw err;
  } finally {
    await tarDone.catch(() => {});
    // A leftover temporary tag is harmless; it must not hide the real outcome.
    await ignoreGone(docker.getImage(tmpRef).remove(deadline())).catch(() => {});
  }
}
