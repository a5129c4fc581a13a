#!/usr/bin/env node
import { rm } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
// Bundles the guest agent (dist/agent/guest/main.js, built by tsc) into a few ES modules
// under dist/agent/bundle/: its entry plus one chunk per lazily loaded op group (diff,
// patch, tar, VM). A sandbox starts the agent on every create, start and reset, and
// Node's ES module loader pays per file (resolution, linking) for the ~120 files of the
// unbundled graph: the bundle starts in about a third of the time (docs/backends.md,
// "Agent start"). node-pty is native and stays in node_modules, loaded on first use.
import { build } from "esbuild";
import { NODE_ESM_BUNDLE } from "./esbuild-node.mjs";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const outdir = join(root, "dist", "agent", "bundle");
await rm(outdir, { recursive: true, force: true });
await build({
  entryPoints: { main: join(root, "dist", "agent", "guest", "main.js") },
  outdir,
  ...NODE_ESM_BUNDLE,
  external: ["node-pty"],
});
