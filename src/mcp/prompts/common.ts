/** What several prompts share: the workspace and environment arguments, and the first step. */
import type { PromptArgument, Step } from "../prompts.js";

export const workspaceArg: PromptArgument = {
  name: "workspace_id",
  description: "An existing workspace (id or name) to continue in, instead of creating one.",
  required: false,
  complete: "workspace",
};
export const environmentArg: PromptArgument = {
  name: "environment",
  description: "Environment for a new workspace (default debian:12).",
  required: false,
  complete: "environment",
};

/** Continue in the given workspace, or create one seeded with `what`. */
export const useOrCreate = (what: string): Step[] => [
  {
    when: "workspace_id",
    tools: ["workspace_status"],
    text: (a) => `Check workspace ${a.workspace_id} with workspace_status (it restarts a sandbox that died).`,
  },
  {
    when: "!workspace_id",
    tools: ["workspace_create"],
    text: (a) =>
      `Create a workspace with workspace_create${a.environment ? ` (environment "${a.environment}")` : ""}, seeded with ${what}; remember its workspace_id.`,
  },
];
