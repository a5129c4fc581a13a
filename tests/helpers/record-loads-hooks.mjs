// Loader hooks for record-loads.mjs: appends `esm <url>` for each module loaded.
import { appendFileSync } from "node:fs";

let out;

export function initialize(data) {
  out = data.out;
}

export async function load(url, context, next) {
  appendFileSync(out, `esm ${url}\n`);
  return next(url, context);
}
