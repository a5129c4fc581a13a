/** Public SDK surface of pyro-mcp: `import { Pyro } from "pyro-mcp"`. */
export { Pyro, type PyroOptions } from "./pyro.js";
export { PyroError, ERROR_CODES, type ErrorCode, type ErrorObject } from "../core/errors.js";
export { OFFICIAL_ENVIRONMENTS, DEFAULT_ENVIRONMENT } from "../env/catalog.js";
export { BACKEND_NAMES, type BackendName } from "../backends/backend.js";
