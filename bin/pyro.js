#!/usr/bin/env node
// Thin launcher: the CLI lives in dist/cli/main.js (built by `npm run build`).
import { main } from "../dist/cli/main.js";

main(process.argv).then((code) => {
  process.exitCode = code;
});
