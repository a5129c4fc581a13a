#!/usr/bin/env node
// Thin launcher: the CLI is dist/cli/main.js (built by `npm run build`), run from its
// bundle (dist/cli-bundle/, scripts/bundle-cli.mjs) when the bundle was made from the
// current build: its stamp holds dist/cli/main.js's modification time, which every tsc
// run changes, so a bundle older than the build is never what runs.
// `pyro run` (a one-shot: a whole process per command) runs the same build as one
// CommonJS file with a V8 code cache (bin/code-cache.js), unless Node was started with
// options of its own (a preload, an inspector, a profiler: they see the modules' files).
// So does `pyro mcp serve`, a process that lives as long as its host's session: the one
// file is read once, at its start. From the ES module bundle, a rebuild or an upgrade in
// place that replaced the bundle's chunks under it failed its next call that needed a
// chunk not loaded yet ("Cannot find module"; Node's resolver looks for the file again
// even for a module it has loaded).
import { readFileSync, statSync } from "node:fs";
import { fileURLToPath } from "node:url";

const dist = new URL("../dist/", import.meta.url);
let bundled = false;
let stamp;
try {
  stamp = JSON.parse(readFileSync(new URL("cli-bundle/stamp.json", dist), "utf8"));
  bundled = stamp.main_mtime_ms === statSync(new URL("cli/main.js", dist)).mtimeMs;
} catch {
  // No bundle (a tsc-only build): the modules themselves.
}
let cli;
const oneFile = process.argv[2] === "run" || (process.argv[2] === "mcp" && process.argv[3] === "serve");
if (bundled && oneFile && process.execArgv.length === 0) {
  try {
    const { loadCached } = await import("./code-cache.js");
    cli = loadCached(fileURLToPath(new URL("cli-bundle/main.cjs", dist)), stamp.cjs_sha256);
  } catch {
    // Not loadable, or not the stamped bytes: the ES module bundle, which is as current.
  }
}
cli ??= { main: (await import(bundled ? "../dist/cli-bundle/main.js" : "../dist/cli/main.js")).main };
cli.main(process.argv).then((code) => {
  cli.saveCache?.();
  process.exitCode = code;
});
