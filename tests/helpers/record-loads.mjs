// Preload (`node --import`) that records every module a process loads into the file
// named by RECORD_LOADS_OUT: ES modules through a loader hook (record-loads-hooks.mjs),
// CommonJS files from require's cache at exit. Used by tests/cli/startup.test.ts.
import { appendFileSync } from "node:fs";
import { createRequire, register } from "node:module";

const out = process.env.RECORD_LOADS_OUT;
if (out) {
  register("./record-loads-hooks.mjs", import.meta.url, { data: { out } });
  const require = createRequire(import.meta.url);
  process.on("exit", () => {
    const files = Object.keys(require.cache).map((f) => `cjs ${f}\n`);
    appendFileSync(out, files.join(""));
  });
}
