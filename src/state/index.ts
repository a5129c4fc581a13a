/** The state store: persistent workspaces, command history, review events, snapshots. */

export { OUTPUT_BUDGET_BYTES, TAIL_BYTES, WORKSPACE_ID_PATTERN } from "./codec.js";
export { MIGRATIONS, type Migration, migrate, SCHEMA_VERSION, schemaVersion } from "./migrations.js";
export { MIN_SECRET_LENGTH, redact, redactor, type SecretValues } from "./redact.js";
export { newWorkspaceId, StateStore, type StateStoreOptions } from "./store.js";
export * from "./types.js";
