/** Public SDK surface of pyro-mcp: `import { Pyro } from "pyro-mcp"`. */

export {
  BACKEND_NAMES,
  type BackendName,
  DEFAULT_ENVIRONMENT,
  type ExecutionMode,
  OFFICIAL_ENVIRONMENTS,
} from "../core/vocabulary.js";
export { ERROR_CODES, type ErrorCode, type ErrorObject, PyroError } from "../errors.js";
export { Pyro, type PyroOptions } from "./pyro.js";
export type {
  BuildEnvironmentOptions,
  CommitOptions,
  CreateWorkspaceOptions,
  DemoOptions,
  DoctorOptions,
  EnvironmentRecipe,
  ExecOptions,
  ExportOptions,
  ListFilesOptions,
  LogsOptions,
  OpenShellOptions,
  PrepareOptions,
  PruneOptions,
  PullOptions,
  ReadFileOptions,
  ReadShellOptions,
  RunOptions,
  ServiceLogsOptions,
  SnapshotOptions,
  StartServiceOptions,
  StopServiceOptions,
  SyncPushOptions,
  UpdateWorkspacePatch,
  WriteShellOptions,
} from "./schemas.js";
// Every named result type (sdk/types.ts).
export type * from "./types.js";
