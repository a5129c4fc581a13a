/**
 * What surfaces (CLI, MCP, SDK, hosts) may name from below core: the shared vocabulary
 * (errors, backend names, execution mode), the environment catalogue's names and the
 * recipe checker (argument checks of env build). Surfaces
 * import these from here, never from backends/ or env/ (tests/unit/architecture.test.ts).
 */

export type { BuildProgress } from "../env/builder.js";
export { DEFAULT_ENVIRONMENT, type EnvironmentSource, OFFICIAL_ENVIRONMENTS } from "../env/catalog.js";
export { checkRecipe } from "../env/recipe.js";
export * from "../errors.js";
export * from "../names.js";
