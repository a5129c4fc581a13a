// The esbuild options both bundles share (scripts/bundle-agent.mjs, scripts/bundle-cli.mjs):
// ES modules for this project's Node, split so that what is imported lazily stays lazy.
export const NODE_ESM_BUNDLE = {
  bundle: true,
  splitting: true,
  format: "esm",
  platform: "node",
  target: "node20",
  chunkNames: "[name]-[hash]",
  logLevel: "warning",
};
