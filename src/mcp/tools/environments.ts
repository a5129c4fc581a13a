import { z } from "zod";
import { buildRecipe } from "../../core/recipes.js";
import { checkRecipe } from "../../core/vocabulary.js";
import { defineTool, mutating } from "../tool.js";
import { defined } from "./common.js";

/**
 * environment_build (contract §10): a recipe's `from`, `apt` and `run`. Host files
 * (`copy`) are not taken over MCP: a model must not carry host files into an environment;
 * the CLI, the SDK and a repository's `.pyro/environment.toml` have them.
 */
export const environmentBuild = defineTool({
  name: "environment_build",
  title: "Build an environment",
  description:
    "Build a reusable environment from a recipe: a base environment (debian:12, debian:12-python, debian:12-node, an OCI image reference, or an earlier build) plus Debian packages (apt) and shell commands (run), run once in a sandbox with network egress. Cached by recipe: the same recipe again returns at once (cache_hit). Then pass its name as workspace_create's environment. A failing step fails the build with that step's output and caches nothing.",
  next: [["workspace_create", "start workspaces on the built environment"]],
  input: z.strictObject({
    name: z
      .string()
      .min(1)
      .max(128)
      .describe(
        "Name for the environment: lowercase letters, digits, '.', '_', '-', optional :TAG (e.g. api-deps:v2).",
      ),
    from: z.string().min(1).describe('Base environment, e.g. "debian:12" or "debian:12-python".'),
    apt: z
      .array(z.string().min(1))
      .max(200)
      .optional()
      .describe('Debian packages to install, e.g. ["libpq-dev"].'),
    run: z
      .array(z.string().min(1))
      .max(64)
      .optional()
      .describe(
        'Shell commands run in order with /bin/sh -c, e.g. ["pip install --break-system-packages poetry"].',
      ),
  }),
  output: z.looseObject({
    name: z.string(),
    recipe_key: z.string(),
    cache_hit: z.boolean(),
    size_bytes: z.number(),
    duration_ms: z.number(),
  }),
  annotations: mutating({ destructive: false, idempotent: true, openWorld: true }),
  long: "building the environment",
  async run(a, ctx) {
    const recipe = checkRecipe(
      { name: a.name, from: a.from, ...defined({ apt: a.apt, run: a.run }) },
      process.cwd(),
    );
    return buildRecipe(ctx.engine, recipe, { signal: ctx.signal });
  },
  render: (r) =>
    `${r.name}: ${r.cache_hit ? "already built (cache hit)" : `built in ${(r.duration_ms / 1000).toFixed(1)} s`}, ${(r.size_bytes / 1e6).toFixed(0)} MB; use environment "${r.name}" in workspace_create`,
});
