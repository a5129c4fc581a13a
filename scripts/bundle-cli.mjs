#!/usr/bin/env node
import { createHash } from "node:crypto";
import { readFileSync, statSync } from "node:fs";
import { rm, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
// Bundles the CLI (dist/cli/main.js, built by tsc) into a few ES modules under
// dist/cli-bundle/: its entry plus chunks for what commands import lazily. A CLI call is
// a new Node process, and Node's ES module loader pays per file (resolution, reading,
// compiling, linking) for the ~140 modules of pyro plus ~100 of zod that `pyro workspace
// exec` loads unbundled; esbuild also drops the parts of zod nothing uses.
// docs/architecture.md "CLI start".
//
// - The bundle sits two levels below the repository like every dist module, so paths
//   made from import.meta.url (the app directory handed to sandboxes, bin/pyro.js) stay
//   right.
// - Native addons, what is loaded on first use and CommonJS that requires by a computed
//   name (jsonc-parser's UMD build) stay in node_modules.
// - `require` is defined from import.meta.url: bundled CommonJS code that requires
//   Node's built-ins needs one in an ES module.
// - bin/pyro.js runs the bundle only when stamp.json names the current build of
//   dist/cli/main.js (tsc rewrites every file): a stale bundle is never run. No stamp is
//   written when dist/ changed while bundling (a concurrent tsc).
// - meta.json lists the modules in each output file (tests/cli/startup.test.ts).
import { build, transform } from "esbuild";
import { NODE_ESM_BUNDLE } from "./esbuild-node.mjs";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const outdir = join(root, "dist", "cli-bundle");
const entry = join(root, "dist", "cli", "main.js");
// What the bundle is made from: main.js as it is now, and no input written after this
// point. Several people build in one checkout: a tsc running while esbuild reads would
// otherwise leave a bundle of old and new modules stamped as current (its main.js
// rewritten before the stamp is read). The file clock lags Date.now by up to a tick.
const started = Date.now() - 20;
const mainBefore = statSync(entry).mtimeMs;
await rm(outdir, { recursive: true, force: true });
const EXTERNAL = [
  "better-sqlite3",
  "node-pty",
  "@xterm/headless",
  "dockerode",
  "ssh2",
  "cpu-features",
  "commander",
  // Its `main` is a UMD build whose factory requires "./impl/format" and others by a
  // call esbuild cannot follow: bundled, that require ran against dist/cli-bundle/
  // and every `pyro host` command failed (tests/cli/startup.test.ts).
  "jsonc-parser",
];
const result = await build({
  absWorkingDir: root,
  entryPoints: { main: entry },
  outdir,
  ...NODE_ESM_BUNDLE,
  external: EXTERNAL,
  banner: {
    js: 'import { createRequire as __pyroCreateRequire } from "node:module"; const require = __pyroCreateRequire(import.meta.url);',
  },
  metafile: true,
});
/**
 * commander inside main.cjs, so its compiled code is in the code cache too (loading it from
 * node_modules, 7 files, cost 18-55 ms of a run here): cli/main.js requires it by
 * createRequire (lazily: `--version` does not load it), a call esbuild does not follow;
 * in this build the call becomes a plain require, which esbuild bundles and keeps lazy.
 */
const CLI_MAIN_COMMANDER = 'createRequire(import.meta.url)("commander")';
const commanderInside = {
  name: "commander-inside",
  setup(b) {
    b.onLoad({ filter: /[/\\]dist[/\\]cli[/\\]main\.js$/ }, (args) => {
      const text = readFileSync(args.path, "utf8");
      if (!text.includes(CLI_MAIN_COMMANDER))
        throw new Error(`${args.path} no longer has ${CLI_MAIN_COMMANDER}`);
      return { contents: text.replace(CLI_MAIN_COMMANDER, 'require("commander")'), loader: "js" };
    });
  },
};
// The same program as one CommonJS file (main.cjs), which bin/pyro.js runs for `pyro run`
// with a V8 code cache (bin/code-cache.js): Node 20 keeps no compiled code between
// processes for ES modules, and a one-shot pays its whole start on every call. What
// commands import lazily stays lazy (esbuild wraps those modules in init functions);
// `import()` of what stays in node_modules becomes require (a vm.Script has no loader
// for import()).
const cjs = await build({
  absWorkingDir: root,
  entryPoints: [entry],
  outfile: join(outdir, "main.cjs"),
  ...NODE_ESM_BUNDLE,
  plugins: [...NODE_ESM_BUNDLE.plugins, commanderInside],
  splitting: false,
  format: "cjs",
  supported: { "dynamic-import": false },
  external: EXTERNAL.filter((e) => e !== "commander"),
  define: { "import.meta.url": "__pyroImportMetaUrl" },
  banner: { js: 'var __pyroImportMetaUrl = require("node:url").pathToFileURL(__filename).href;' },
  metafile: true,
});
// bin/code-cache.js reads main.cjs as latin1, a one-byte string (UTF-8 decoding of its
// ~2.6 MB costs 10-30 ms here), so it is made ASCII: esbuild escapes what is past 0x7f in
// code, and comments kept from tsc's output (an "→", a "—") get a "?" instead. That this
// changed only comments is checked: esbuild's whitespace minifier (which drops comments
// and nothing else) makes the same code of both.
const cjsPath = join(outdir, "main.cjs");
const cjsText = readFileSync(cjsPath, "utf8");
const asciiText = cjsText.replace(/[^\0-\x7f]/g, "?");
if (asciiText !== cjsText) {
  const stripped = (code) => transform(code, { minifyWhitespace: true, format: "cjs" }).then((r) => r.code);
  if ((await stripped(cjsText)) !== (await stripped(asciiText))) {
    console.error(
      "bundle-cli: main.cjs has non-ASCII characters outside comments (bin/code-cache.js reads it as latin1)",
    );
    process.exit(1);
  }
  await writeFile(cjsPath, asciiText);
}
const meta = Object.fromEntries(
  [...Object.entries(result.metafile.outputs), ...Object.entries(cjs.metafile.outputs)].map(([out, o]) => [
    out,
    Object.keys(o.inputs),
  ]),
);
await writeFile(join(outdir, "meta.json"), `${JSON.stringify(meta, null, 1)}\n`);
const changed = Object.keys({ ...result.metafile.inputs, ...cjs.metafile.inputs }).filter(
  (i) => i.startsWith("dist/") && statSync(join(root, i)).mtimeMs >= started,
);
if (statSync(entry).mtimeMs !== mainBefore || changed.length > 0) {
  // No stamp: bin/pyro.js runs the modules until a bundle is made from a settled build.
  console.error(
    `bundle-cli: dist/ changed while bundling (${changed.slice(0, 3).join(", ") || "dist/cli/main.js"}); the bundle is not used: run it again`,
  );
  process.exit(1);
}
// main.cjs's SHA-256: bin/code-cache.js runs no other bytes (a concurrent build's, say).
const cjsSha256 = createHash("sha256").update(readFileSync(cjsPath)).digest("hex");
await writeFile(
  join(outdir, "stamp.json"),
  JSON.stringify({ main_mtime_ms: mainBefore, cjs_sha256: cjsSha256 }),
);
