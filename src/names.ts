/**
 * The shared vocabulary of every floor (with errors.ts): the names that surfaces, core,
 * state and backends all speak. It imports nothing, so anything may import it.
 */

/** Isolation backends, strongest first (the default choice walks this order). */
export const BACKEND_NAMES = ["firecracker", "qemu", "gvisor", "docker", "bwrap", "host"] as const;
export type BackendName = (typeof BACKEND_NAMES)[number];

/** `guest_agent` for an isolating backend, `host_compat` for the `host` backend. */
export type ExecutionMode = "guest_agent" | "host_compat";
