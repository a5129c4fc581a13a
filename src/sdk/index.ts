/** Public SDK surface of pyro-mcp: `import { Pyro } from "pyro-mcp"`. */

export { BACKEND_NAMES, type BackendName } from "../backends/backend.js";
export { ERROR_CODES, type ErrorCode, type ErrorObject, PyroError } from "../core/errors.js";
export { DEFAULT_ENVIRONMENT, OFFICIAL_ENVIRONMENTS } from "../env/catalog.js";
export { Pyro, type PyroOptions } from "./pyro.js";
