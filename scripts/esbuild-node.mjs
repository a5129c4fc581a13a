// The esbuild options both bundles share (scripts/bundle-agent.mjs, scripts/bundle-cli.mjs):
// ES modules for this project's Node, split so that what is imported lazily stays lazy.
import { dirname, join } from "node:path";

/**
 * zod exports every message locale as a namespace (`z.locales`, `z.core.locales`): ~70
 * modules that a bundle keeps whole once `import * as z` is used, although only English
 * (which zod installs itself) is ever used here. Compiling them was ~40% of the classic
 * build's share of a CLI call. The namespace is replaced by one holding `en` alone.
 */
const zodEnglishOnly = {
  name: "zod-english-only",
  setup(build) {
    build.onResolve({ filter: /^\.\.\/locales\/index\.js$/ }, (args) =>
      /[/\\]zod[/\\]v4[/\\]/.test(args.importer)
        ? { path: join(dirname(args.importer), "..", "locales", "index.js"), namespace: "zod-locales" }
        : undefined,
    );
    build.onLoad({ filter: /.*/, namespace: "zod-locales" }, (args) => ({
      contents: 'export { default as en } from "./en.js";\n',
      resolveDir: dirname(args.path),
      loader: "js",
    }));
  },
};

export const NODE_ESM_BUNDLE = {
  bundle: true,
  splitting: true,
  format: "esm",
  platform: "node",
  target: "node20",
  chunkNames: "[name]-[hash]",
  logLevel: "warning",
  plugins: [zodEnglishOnly],
};
