/** The repro-fix mode's prompts: reproduce and fix (use case 2), and parallel workspaces (use case 3). */
import type { PromptDefinition } from "../prompts.js";
import { environmentArg, useOrCreate, workspaceArg } from "./common.js";

export const reproFix: PromptDefinition = {
  name: "repro-fix",
  title: "Reproduce and fix a failure",
  description:
    "Reproduce a failing command in an isolated workspace, fix it with a structured patch, rerun until it passes, review the diff and take the fix out.",
  follows: { mode: "repro-fix", use_case: "2. repro plus fix loop" },
  arguments: [
    { name: "command", description: "The failing command, e.g. `npm test`.", required: true },
    { name: "issue", description: "The issue text or error report, if any.", required: false },
    workspaceArg,
    environmentArg,
  ],
  needs: ["workspace_exec", "workspace_patch_apply", "workspace_diff"],
  intro: (a) =>
    `Reproduce and fix the failure of \`${a.command}\` in an isolated pyro workspace; nothing you run touches the host.${a.issue ? `\n\nThe report:\n${a.issue}` : ""}`,
  steps: [
    ...useOrCreate("the project (omit seed_path to use the server's default seed)"),
    {
      tools: ["workspace_exec"],
      text: (a) =>
        `Reproduce: run \`${a.command}\` with workspace_exec. A non-zero exit_code is the failure you are after, not a tool error; read stdout and stderr (long output keeps its head and tail).`,
    },
    {
      tools: ["workspace_file_list", "workspace_file_read"],
      text: () =>
        "Find the cause: workspace_file_list and workspace_file_read on the files the output points at.",
    },
    {
      tools: ["workspace_patch_apply"],
      text: () =>
        "Fix it with workspace_patch_apply (a unified diff; a bare @@ header is located by its context). A rejected hunk changes nothing: read the file again and retry.",
    },
    {
      tools: ["workspace_exec"],
      text: (a) => `Rerun \`${a.command}\` with workspace_exec; repeat the fix until it exits 0.`,
    },
    {
      tools: ["workspace_diff"],
      text: () => "Review the whole change with workspace_diff: keep it minimal, no debugging leftovers.",
    },
    {
      tools: ["workspace_commit"],
      text: () =>
        "Hand the fix back with workspace_commit: one commit on a new branch of the seed repository, without touching the user's working tree or current branch.",
    },
    {
      tools: ["workspace_export"],
      unless: "workspace_commit",
      text: () =>
        "Take the fix out with workspace_export (a file or directory to a host path) if the user wants it.",
    },
    {
      tools: ["workspace_reset"],
      text: () =>
        "To try another approach from scratch, workspace_reset returns the workspace to its seed exactly.",
    },
    {
      tools: ["workspace_summary"],
      text: () => "Report back from workspace_summary: what failed, what you changed, the final result.",
    },
  ],
  outro: "Report the root cause, the patch, and the command's final exit code.",
};

export const parallelWorkspaces: PromptDefinition = {
  name: "parallel-workspaces",
  title: "Try approaches in parallel workspaces",
  description:
    "Several named, labelled workspaces at once (one per approach or variant), each isolated from the others, listed and resumed by name, compared at the end.",
  follows: { mode: "repro-fix", use_case: "3. parallel isolated workspaces" },
  arguments: [
    {
      name: "variants",
      description: "The approaches or variants to try, one per line (each gets its own workspace).",
      required: true,
    },
    { name: "command", description: "The command that decides which variant works.", required: true },
    {
      name: "label",
      description: "A label value grouping the workspaces (default: parallel).",
      required: false,
    },
    environmentArg,
  ],
  needs: ["workspace_create", "workspace_list", "workspace_exec", "workspace_patch_apply"],
  intro: (a) =>
    `Try each of these variants in its own isolated pyro workspace and compare them with \`${a.command}\`:\n${a.variants}`,
  steps: [
    {
      tools: ["workspace_create"],
      text: (a) =>
        `For each variant, workspace_create with a short unique name (e.g. the variant's slug) and labels {"group": "${a.label ?? "parallel"}"}${a.environment ? `, environment "${a.environment}"` : ""}. Workspaces share nothing: a change in one never shows in another.`,
    },
    {
      tools: ["workspace_patch_apply"],
      text: () => "Apply each variant's change in its own workspace with workspace_patch_apply.",
    },
    {
      tools: ["workspace_exec"],
      text: (a) => `Run \`${a.command}\` in each with workspace_exec; note exit codes and key output.`,
    },
    {
      tools: ["workspace_list"],
      text: (a) =>
        `workspace_list shows them all (label group=${a.label ?? "parallel"}); any tool takes a workspace's name in place of its id, so you can resume one by name later.`,
    },
    {
      tools: ["workspace_diff"],
      text: () => "Compare the winners' changes with workspace_diff.",
    },
    {
      tools: ["workspace_export"],
      text: () => "Export the best variant's change with workspace_export.",
    },
    {
      tools: ["workspace_delete"],
      text: () => "Delete the workspaces you no longer need with workspace_delete.",
    },
  ],
  outro: "Report a table: variant, workspace name, exit code, verdict; then your recommendation.",
};
