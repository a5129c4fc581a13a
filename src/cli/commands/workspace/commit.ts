import type { Command } from "commander";
import { commitWorkspace } from "../../../core/commit.js";
import type { CliContext } from "../../main.js";
import { act } from "../../output.js";

/** `pyro workspace commit ID [--branch B] [--message M] [--force]`. */
export function registerCommit(ws: Command, ctx: CliContext): void {
  ws.command("commit")
    .description(
      "write the workspace's changes since its baseline as one commit on a new branch of its seed repository on the host (working tree, index and HEAD untouched)",
    )
    .argument("<id>", "workspace id or name")
    .option("--branch <name>", "branch to create (default pyro/<name or id>)")
    .option("--message <text>", "commit message")
    .option("--force", "move the branch if it exists (never the checked-out one)")
    .option("--json", "print the structured result")
    .action(async (id: string, o: { branch?: string; message?: string; force?: boolean; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () =>
          commitWorkspace(ctx.engine().workspaces, id, {
            branch: o.branch,
            message: o.message,
            force: o.force === true,
            signal: ctx.signal,
          }),
        (r) =>
          [
            `committed ${r.files.length} changed file(s) as ${r.commit.slice(0, 12)} on branch ${r.branch}${r.replaced ? ` (was ${r.replaced.slice(0, 12)})` : ""}`,
            `  repository: ${r.repository}`,
            `  parent:     ${r.parent.slice(0, 12)} (the seed commit)`,
            ...r.files.slice(0, 20).map((f) => `  ${f.status.padEnd(8)} ${f.path}`),
            ...(r.files.length > 20 ? [`  ... and ${r.files.length - 20} more`] : []),
            `  see it with: git -C ${r.repository} log -1 --stat ${r.branch}`,
          ].join("\n"),
      );
    });
}
