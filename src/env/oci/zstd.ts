import { spawn } from "node:child_process";
import type { Readable } from "node:stream";
import { PyroError } from "../../errors.js";

/**
 * Decompresses a zstd layer with the `zstd` program (Node 20's zlib has no zstd; Debian's
 * `zstd` package is in scripts/setup). Its failure fails the stream.
 */
export function zstdStream(input: Readable): Readable {
  const child = spawn("zstd", ["-dc"], { stdio: ["pipe", "pipe", "pipe"] });
  const out = child.stdout;
  // zstd stopping early (an error) closes its stdin: that failure is reported below.
  child.stdin.on("error", () => {});
  input.pipe(child.stdin);
  out.once("close", () => {
    if (child.exitCode === null) child.kill();
  });
  let err = "";
  child.stderr.on("data", (d: Buffer) => {
    err += d.toString().slice(0, 500);
  });
  child.on("error", (e) =>
    out.destroy(
      new PyroError(
        "build_failed",
        `cannot run zstd to unpack a zstd layer: ${e.message}`,
        "install Debian's zstd package",
      ),
    ),
  );
  child.on("close", (code) => {
    if (code !== 0) out.destroy(new PyroError("build_failed", `zstd failed on a layer: ${err.trim()}`));
  });
  return out;
}
