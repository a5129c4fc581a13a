import { z } from "zod";
import { commitWorkspace } from "../../core/commit.js";
import { PyroError } from "../../errors.js";
import { changeEntry, workspaceIdArg } from "../schemas.js";
import { defineTool, mutating } from "../tool.js";
import { defined } from "./common.js";

export const workspaceCommit = defineTool({
  name: "workspace_commit",
  title: "Commit to a host branch",
  description:
    "Write the workspace's changes since its baseline (what workspace_diff shows: .gitignore honoured, .git left out) as ONE commit on a NEW branch of the seed repository on the host, parented on the seed commit. The user's working tree, index, current branch and other branches are not touched; they review the branch with git log / git diff. Default branch: pyro/<workspace name or id>. An existing branch is a conflict; force: true moves it, and only for branches under pyro/. Needs a workspace seeded from a Git checkout or repository URL (conflict otherwise). The result names the repository, the branch, the commit and the changed files.",
  next: [["workspace_summary", "report what was done"]],
  input: z.strictObject({
    workspace_id: workspaceIdArg,
    branch: z
      .string()
      .min(1)
      .max(200)
      .optional()
      .describe("Branch to create, e.g. pyro/fix-login (default pyro/<workspace name or id>)."),
    message: z
      .string()
      .min(1)
      .max(65_536)
      .optional()
      .describe("Commit message (subject line, blank line, body)."),
    force: z
      .boolean()
      .optional()
      .describe("Move the branch if it already exists (only branches under pyro/; default false)."),
  }),
  output: z.looseObject({
    workspace_id: z.string(),
    branch: z.string(),
    commit: z.string(),
    parent: z.string(),
    repository: z.string(),
    replaced: z.string().nullable(),
    files: z.array(changeEntry),
  }),
  annotations: mutating({ destructive: false, idempotent: false }),
  long: "committing",
  async run(a, ctx) {
    // A model may move its own branches, never the user's.
    if (a.force === true && !(a.branch ?? "pyro/").startsWith("pyro/"))
      throw new PyroError(
        "invalid_argument",
        `force moves only branches under pyro/, not '${a.branch}'`,
        "commit to a new branch, or let the user move theirs with pyro workspace commit --force",
      );
    return commitWorkspace(
      ctx.ws,
      a.workspace_id,
      defined({ branch: a.branch, message: a.message, force: a.force, signal: ctx.signal }),
    );
  },
  render: (r) =>
    `committed ${r.files.length} changed file(s) as ${r.commit.slice(0, 12)} on branch ${r.branch} of ${r.repository} (parent ${r.parent.slice(0, 12)}, the seed commit)${r.replaced ? `; the branch was at ${r.replaced.slice(0, 12)}` : ""}`,
});
