/** Public SDK surface of pyro-mcp: `import { Pyro } from "pyro-mcp"`. */

export {
  BACKEND_NAMES,
  type BackendName,
  DEFAULT_ENVIRONMENT,
  OFFICIAL_ENVIRONMENTS,
} from "../core/vocabulary.js";
export { ERROR_CODES, type ErrorCode, type ErrorObject, PyroError } from "../errors.js";
export { Pyro, type PyroOptions } from "./pyro.js";
