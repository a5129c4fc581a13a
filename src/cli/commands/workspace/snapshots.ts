import type { Command } from "commander";
import { createSnapshot, deleteSnapshot, listSnapshots, resetWorkspace } from "../../../core/snapshots.js";
import type { CliContext } from "../../main.js";
import { act, table } from "../../output.js";

export function registerSnapshots(ws: Command, ctx: CliContext): void {
  ws.command("reset")
    .description("restore /workspace exactly to the baseline (or a snapshot); stops running processes")
    .argument("<id>", "workspace id or name")
    .option("--snapshot <name>", "snapshot to restore (default: baseline)")
    .option("--json", "print the structured result")
    .action(async (id: string, o: { snapshot?: string; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => resetWorkspace(ctx.engine().workspaces, id, o.snapshot ? { snapshot: o.snapshot } : {}),
        (r) =>
          `reset ${r.workspace_id} to ${r.workspace_reset.snapshot_name} in ${r.workspace_reset.duration_ms} ms (reset #${r.reset_count})`,
      );
    });

  const snap = ws.command("snapshot").description("named checkpoints of /workspace");
  snap
    .command("create")
    .argument("<id>", "workspace id or name")
    .argument("<name>", "snapshot name")
    .option("--json", "print the structured result")
    .action(async (id: string, name: string, o: { json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => createSnapshot(ctx.engine().workspaces, id, name),
        (r) => `snapshot ${r.snapshot_name}: ${r.file_count} files`,
      );
    });
  snap
    .command("list")
    .argument("<id>", "workspace id or name")
    .option("--json", "print the structured result")
    .action(async (id: string, o: { json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => listSnapshots(ctx.engine().workspaces, id),
        (r) =>
          table(
            ["name", "kind", "files", "created"],
            r.snapshots.map((s) => [s.snapshot_name, s.kind, String(s.file_count), s.created_at]),
          ),
      );
    });
  snap
    .command("delete")
    .argument("<id>", "workspace id or name")
    .argument("<name>", "snapshot name")
    .option("--json", "print the structured result")
    .action(async (id: string, name: string, o: { json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => deleteSnapshot(ctx.engine().workspaces, id, name),
        (r) => `deleted snapshot ${r.snapshot_name}`,
      );
    });
}
