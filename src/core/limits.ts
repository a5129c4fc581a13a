/**
 * The ranges of a workspace's limits, in one place (a module of its own, with no imports:
 * the host onramps read it without loading the core): the core refuses values outside them
 * (checkLimits, checkDiskMib, exec's timeout) and the MCP and SDK schemas state them.
 */
export const LIMITS = {
  vcpus: { min: 1, max: 64 },
  /** The agent and a shell need about 40 MiB. */
  memory_mib: { min: 64, max: 1024 * 1024 },
  disk_mib: { min: 64, max: 16 * 1024 * 1024 },
  ttl_seconds: { min: 1, max: 10 * 365 * 86_400 },
  /** A command's timeout (more than 0). */
  timeout_seconds: { max: 86_400 },
} as const;
