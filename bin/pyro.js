#!/usr/bin/env node
// Thin launcher: the CLI is dist/cli/main.js (built by `npm run build`), run from its
// bundle (dist/cli-bundle/, scripts/bundle-cli.mjs) when the bundle was made from the
// current build: its stamp holds dist/cli/main.js's modification time, which every tsc
// run changes, so a bundle older than the build is never what runs.
import { readFileSync, statSync } from "node:fs";

const dist = new URL("../dist/", import.meta.url);
let entry = "../dist/cli/main.js";
try {
  const stamp = JSON.parse(readFileSync(new URL("cli-bundle/stamp.json", dist), "utf8"));
  if (stamp.main_mtime_ms === statSync(new URL("cli/main.js", dist)).mtimeMs)
    entry = "../dist/cli-bundle/main.js";
} catch {
  // No bundle (a tsc-only build): the modules themselves.
}
const { main } = await import(entry);
main(process.argv).then((code) => {
  process.exitCode = code;
});
