/**
 * Profiles and modes as data: which tools a server exposes. A profile is a capability
 * level; a mode is a curated set for one workflow (CONTRACT §5). Pinned by
 * tests/unit/mcp/profiles.test.ts; docs/mcp.md lists the same sets.
 */
import { PyroError } from "../errors.js";

export const TOOL_NAMES = [
  "vm_run",
  "workspace_create",
  "workspace_list",
  "workspace_update",
  "workspace_status",
  "workspace_sync_push",
  "workspace_exec",
  "workspace_logs",
  "workspace_summary",
  "workspace_file_list",
  "workspace_file_read",
  "workspace_file_write",
  "workspace_patch_apply",
  "workspace_diff",
  "workspace_export",
  "workspace_reset",
  "workspace_delete",
  "snapshot_create",
  "snapshot_list",
  "snapshot_delete",
  "workspace_stop",
  "workspace_start",
  "workspace_network_blocks",
  "service_start",
  "service_list",
  "service_status",
  "service_logs",
  "service_stop",
  "workspace_disk_list",
  "workspace_disk_read",
  "workspace_disk_export",
  "shell_open",
  "shell_read",
  "shell_write",
  "shell_signal",
  "shell_close",
  "workspace_commit",
  "environment_build",
] as const;
export type ToolName = (typeof TOOL_NAMES)[number];

const CORE: readonly ToolName[] = [
  "vm_run",
  "workspace_create",
  "workspace_list",
  "workspace_update",
  "workspace_status",
  "workspace_sync_push",
  "workspace_exec",
  "workspace_logs",
  "workspace_summary",
  "workspace_file_list",
  "workspace_file_read",
  "workspace_file_write",
  "workspace_patch_apply",
  "workspace_diff",
  "workspace_export",
  "workspace_reset",
  "workspace_delete",
];

/**
 * workspace-full: every tool there is, in TOOL_NAMES's order (workspace-core's first), so
 * a new tool is in it without a second list. Network approval is never a tool: a model
 * must not approve its own egress (the CLI and the SDK have it).
 */
const FULL: readonly ToolName[] = TOOL_NAMES;

export interface ToolSet {
  kind: "profile" | "mode";
  name: string;
  description: string;
  tools: readonly ToolName[];
  /** workspace_create also takes `network_policy`, `published_ports` and `secrets` (the full profile's options on create). */
  fullCreate: boolean;
}

export const PROFILES = {
  "vm-run": {
    kind: "profile",
    name: "vm-run",
    description: "one-shot commands in a throwaway sandbox, nothing persistent",
    tools: ["vm_run"],
    fullCreate: false,
  },
  "workspace-core": {
    kind: "profile",
    name: "workspace-core",
    description: "the persistent workspace loop: create, exec, edit, diff, export, reset, delete",
    tools: CORE,
    fullCreate: false,
  },
  "workspace-full": {
    kind: "profile",
    name: "workspace-full",
    description:
      "workspace-core plus snapshots, services, shells, stop/start, stopped-workspace disk tools, network blocks, and secrets, network and published ports on create",
    tools: FULL,
    fullCreate: true,
  },
} as const satisfies Record<string, ToolSet>;

export const MODES = {
  "repro-fix": {
    kind: "mode",
    name: "repro-fix",
    description: "reproduce a failure, patch, rerun, diff, export, reset; several named workspaces at once",
    tools: [
      "workspace_create",
      "workspace_list",
      "workspace_status",
      "workspace_update",
      "workspace_exec",
      "workspace_file_list",
      "workspace_file_read",
      "workspace_file_write",
      "workspace_patch_apply",
      "workspace_diff",
      "workspace_export",
      "workspace_commit",
      "workspace_reset",
      "workspace_summary",
      "workspace_delete",
    ],
    fullCreate: false,
  },
  inspect: {
    kind: "mode",
    name: "inspect",
    description:
      "inspect untrusted code with the smallest persistent surface: read, run, report, export; no edit tools",
    tools: [
      "workspace_create",
      "workspace_list",
      "workspace_status",
      "workspace_file_list",
      "workspace_file_read",
      "workspace_exec",
      "workspace_export",
      "workspace_summary",
      "workspace_delete",
    ],
    fullCreate: false,
  },
  "cold-start": {
    kind: "mode",
    name: "cold-start",
    description:
      "validate a fresh repository: start its services and wait until ready, run its checks, read and export the reports, reset and retry",
    tools: [
      "workspace_create",
      "workspace_status",
      "workspace_exec",
      "workspace_logs",
      "service_start",
      "service_list",
      "service_status",
      "service_logs",
      "service_stop",
      "workspace_file_list",
      "workspace_file_read",
      "workspace_export",
      "workspace_reset",
      "workspace_summary",
      "workspace_delete",
    ],
    // A fresh repository installs its dependencies (network policy) and serves on a
    // published port: the use case needs the full create options.
    fullCreate: true,
  },
  "review-eval": {
    kind: "mode",
    name: "review-eval",
    description:
      "review and evaluate: interactive shells, checkpoint snapshots, run evaluations, diff, reset to a checkpoint, export",
    tools: [
      "workspace_create",
      "workspace_status",
      "workspace_exec",
      "workspace_file_list",
      "workspace_file_read",
      "workspace_diff",
      "shell_open",
      "shell_read",
      "shell_write",
      "shell_signal",
      "shell_close",
      "snapshot_create",
      "snapshot_list",
      "workspace_reset",
      "workspace_export",
      "workspace_summary",
      "workspace_delete",
    ],
    fullCreate: false,
  },
} as const satisfies Record<string, ToolSet>;

export type ProfileName = keyof typeof PROFILES;
export type ModeName = keyof typeof MODES;
export const PROFILE_NAMES = Object.keys(PROFILES) as ProfileName[];
export const MODE_NAMES = Object.keys(MODES) as ModeName[];
export const DEFAULT_PROFILE: ProfileName = "workspace-core";

/** A server serves one profile or one mode. */
export type Selection = { profile: ProfileName } | { mode: ModeName };

/** The tool set of a profile or mode (the default profile when neither is given). */
export function toolSet(selection: Partial<{ profile: string; mode: string }> = {}): ToolSet {
  if (selection.profile !== undefined && selection.mode !== undefined) {
    throw new PyroError("invalid_argument", "pass either --mode or --profile, not both");
  }
  if (selection.mode !== undefined) {
    const m = (MODES as Record<string, ToolSet>)[selection.mode];
    if (!m)
      throw new PyroError(
        "invalid_argument",
        `unknown mode '${selection.mode}'`,
        `modes: ${MODE_NAMES.join(", ")}`,
      );
    return m;
  }
  const name = selection.profile ?? DEFAULT_PROFILE;
  const p = (PROFILES as Record<string, ToolSet>)[name];
  if (!p)
    throw new PyroError(
      "invalid_argument",
      `unknown profile '${name}'`,
      `profiles: ${PROFILE_NAMES.join(", ")}`,
    );
  return p;
}

/** The tool names of a profile or mode, in listing order. */
export function toolNames(selection: Partial<{ profile: string; mode: string }> = {}): ToolName[] {
  return [...toolSet(selection).tools];
}
