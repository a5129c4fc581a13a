import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["tests/**/*.test.ts"],
    testTimeout: 60_000,
    hookTimeout: 600_000,
    // Real sandboxes share the 2-core CI machine; files run in parallel, tests in a file in order.
    fileParallelism: true,
    maxWorkers: 2,
    // No pool of started sandboxes unless a test asks (tests/integration/bwrap/pool.test.ts
    // proves `mcp serve`'s default of one): a server a test kills would leave its spare
    // running until the next server of that home reaps it.
    env: { PYRO_POOL: "0" },
    // .ci/run sets PYRO_TEST_JSON to read the counts for its closing line.
    reporters: process.env.PYRO_TEST_JSON
      ? ["default", ["json", { outputFile: process.env.PYRO_TEST_JSON }]]
      : ["default"],
  },
});
