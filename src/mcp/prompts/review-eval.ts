/** The review-eval mode's prompt: review and evaluation (use case 5). */
import type { PromptDefinition } from "../prompts.js";
import { environmentArg, useOrCreate, workspaceArg } from "./common.js";

export const reviewEval: PromptDefinition = {
  name: "review-eval",
  title: "Review and evaluate a change",
  description:
    "Shell-driven review and evaluation: checkpoint a snapshot, evaluate in an interactive shell, compare against the checkpoint, reset to it between rounds, export the results.",
  follows: { mode: "review-eval", use_case: "5. review and evaluation" },
  arguments: [
    { name: "eval_command", description: "The evaluation to run (e.g. `pytest -q`).", required: true },
    { name: "focus", description: "What the review should focus on.", required: false },
    {
      name: "snapshot",
      description: "An existing checkpoint to start from (default: take one named 'checkpoint').",
      required: false,
      complete: "snapshot",
    },
    workspaceArg,
    environmentArg,
  ],
  needs: ["shell_open", "shell_write", "shell_read", "snapshot_create", "workspace_reset"],
  intro: (a) =>
    `Review and evaluate the code in a pyro workspace with \`${a.eval_command}\`.${a.focus ? ` Focus: ${a.focus}` : ""}`,
  steps: [
    ...useOrCreate("the code under review"),
    {
      tools: ["snapshot_create"],
      when: "!snapshot",
      text: () => 'Checkpoint the starting point with snapshot_create (snapshot_name "checkpoint").',
    },
    {
      tools: ["workspace_reset"],
      when: "snapshot",
      text: (a) => `Start from checkpoint "${a.snapshot}": workspace_reset with snapshot "${a.snapshot}".`,
    },
    {
      tools: ["shell_open", "shell_write", "shell_read"],
      text: (a) =>
        `Open a shell with shell_open, run \`${a.eval_command}\` with shell_write (end the input with a newline), and read the result with shell_read (plain: true, wait_for_idle_ms ~ 1000; keep reading with next_cursor until it is done).`,
    },
    {
      tools: ["shell_signal"],
      text: () => "A hung evaluation: shell_signal INT.",
    },
    {
      tools: ["workspace_diff"],
      text: (a) =>
        `Compare what the evaluation changed with workspace_diff (snapshot "${a.snapshot ?? "checkpoint"}").`,
    },
    {
      tools: ["workspace_reset"],
      text: (a) =>
        `Between rounds, workspace_reset with snapshot "${a.snapshot ?? "checkpoint"}" returns to the checkpoint exactly (shells end with it).`,
    },
    {
      tools: ["workspace_export"],
      text: () => "Export the evaluation's results with workspace_export.",
    },
    {
      tools: ["shell_close"],
      text: () => "Close shells you no longer need with shell_close.",
    },
    {
      tools: ["workspace_summary"],
      text: () => "Finish with workspace_summary.",
    },
  ],
  outro: "Report the evaluation's outcome per round, what you changed between rounds, and your review.",
};
