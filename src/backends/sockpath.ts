import { open } from "node:fs/promises";
import { basename, dirname } from "node:path";

/** sun_path holds 108 bytes including the terminating NUL. */
const MAX_SUN_PATH = 107;

/**
 * Runs `fn` with a path that reaches the unix socket `path` even when `path` is longer
 * than a socket address can hold: then it goes through `/proc/self/fd/N/<name>`, where N
 * is an open descriptor of the socket's directory (Linux resolves it like any path).
 * The descriptor stays open until `fn` settles, so `fn` must have connected by then.
 * Firecracker itself never sees long paths: it gets them relative to its working directory.
 */
export async function withSocketPath<T>(path: string, fn: (usable: string) => Promise<T>): Promise<T> {
  if (Buffer.byteLength(path) <= MAX_SUN_PATH) return fn(path);
  const dir = await open(dirname(path), "r");
  try {
    return await fn(`/proc/self/fd/${dir.fd}/${basename(path)}`);
  } finally {
    await dir.close();
  }
}
