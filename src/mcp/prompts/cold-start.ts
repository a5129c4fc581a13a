/** The cold-start mode's prompt: cold-start repository validation (use case 1). */
import type { PromptDefinition } from "../prompts.js";
import { environmentArg, useOrCreate, workspaceArg } from "./common.js";

export const coldStart: PromptDefinition = {
  name: "cold-start",
  title: "Validate a fresh repository",
  description:
    "Cold-start validation of a repository: seed a workspace, install and run its checks, start its service and wait until ready, read the reports and export them.",
  follows: { mode: "cold-start", use_case: "1. cold-start repo validation" },
  arguments: [
    {
      name: "check_command",
      description: "The repository's validation command (default: find it in its README or manifest).",
      required: false,
    },
    {
      name: "service_command",
      description: "A long-running command to start and probe (e.g. `npm start`).",
      required: false,
    },
    {
      name: "service_name",
      description: "The service's name (default app).",
      required: false,
      complete: "service",
    },
    workspaceArg,
    environmentArg,
  ],
  needs: ["workspace_exec", "service_start", "service_logs"],
  intro: () =>
    "Validate this repository from a cold start in a pyro workspace: does it install, pass its checks and come up?",
  steps: [
    ...useOrCreate("the repository (omit seed_path for the server's default seed)"),
    {
      tools: ["workspace_file_read"],
      when: "!check_command",
      text: () =>
        "Find how it is validated: workspace_file_read on README, package.json, Makefile, pyproject.toml or the CI config.",
    },
    {
      tools: ["workspace_exec"],
      text: (a) =>
        `Install its dependencies, then run ${a.check_command ? `\`${a.check_command}\`` : "its checks"} with workspace_exec. A non-zero exit code is a finding, not a tool error.`,
    },
    {
      tools: ["service_start"],
      text: (a) =>
        `Start ${a.service_command ? `\`${a.service_command}\`` : "its server"} with service_start as "${a.service_name ?? "app"}", with a readiness probe (e.g. {type: "tcp", port: 3000} or {type: "http", url: "http://127.0.0.1:3000/"}) so the call returns once it is ready.`,
    },
    {
      tools: ["service_status", "service_logs"],
      text: (a) =>
        `If it is not ready, read service_status and service_logs of "${a.service_name ?? "app"}" for why.`,
    },
    {
      tools: ["workspace_logs"],
      text: () => "workspace_logs shows an earlier command's full output without rerunning it.",
    },
    {
      tools: ["workspace_export"],
      text: () => "Export the test reports or build output with workspace_export.",
    },
    {
      tools: ["workspace_reset"],
      text: () => "To retry from the pristine checkout, workspace_reset.",
    },
    {
      tools: ["workspace_summary"],
      text: () => "Finish with workspace_summary for the report.",
    },
  ],
  outro:
    "Report: install ok?, checks passed/failed (with the failing ones), service ready?, and what to fix first.",
};
