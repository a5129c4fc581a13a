import type { Command } from "commander";
import type { WorkspaceView } from "../../../core/views.js";
import { backendName, collect, keyValues, wholeNumber } from "../../args.js";
import type { CliContext } from "../../main.js";
import { act, table } from "../../output.js";

export function renderWorkspace(w: WorkspaceView): string {
  return [
    `workspace ${w.workspace_id}${w.name ? ` (${w.name})` : ""}: ${w.state}`,
    `  environment ${w.environment}, backend ${w.backend} (${w.execution_mode}), network ${w.network_policy}`,
    ...(w.published_ports.length > 0
      ? [
          `  published: ${w.published_ports.map((p) => `127.0.0.1:${p.host_port} -> ${p.guest_port}`).join(", ")}`,
        ]
      : []),
    `  seed: ${w.workspace_seed.kind}${w.workspace_seed.source ? ` ${w.workspace_seed.source}` : ""}${w.workspace_seed.commit ? ` @ ${w.workspace_seed.commit.slice(0, 12)}` : ""} (${w.workspace_seed.file_count} files${seedSkipped(w.workspace_seed.skipped)})`,
    ...(w.workspace_seed.repository
      ? [`  commits go to: ${w.workspace_seed.repository} (pyro workspace commit)`]
      : []),
    `  secrets: ${w.secrets.map((x) => `${x.name} (${x.kind})`).join(", ") || "-"}`,
    `  labels: ${
      Object.entries(w.labels)
        .map(([k, v]) => `${k}=${v}`)
        .join(", ") || "-"
    }`,
    `  last activity ${w.last_activity_at}, expires ${w.expires_at ?? "never"}, resets ${w.reset_count}`,
  ].join("\n");
}

export function registerLifecycle(ws: Command, ctx: CliContext): void {
  ws.command("create")
    .description("create a workspace seeded from a directory or Git checkout (or a repository URL)")
    .argument("[env]", "environment", "debian:12")
    .option("--seed-path <path>", "directory or Git checkout to copy into /workspace (tracked files for Git)")
    .option("--repo-url <url>", "clone this repository as the seed")
    .option("--repo-ref <ref>", "branch, tag or commit for --repo-url")
    .option("--name <name>", "unique name to address the workspace by")
    .option("--label <K=V>", "label (repeatable)", collect)
    .option(
      "--network <policy>",
      "network policy: off (default), egress or allowlist:HOST[,HOST...] (docs/network.md)",
    )
    .option(
      "--publish <HOST:GUEST>",
      "bind 127.0.0.1:HOST on the host to GUEST in the workspace; HOST 0 picks a free port (repeatable)",
      collect,
    )
    .option("--env <K=V>", "environment variable for every command (repeatable)", collect)
    .option(
      "--secret <NAME=SPEC>",
      "secret for every command: NAME=value, NAME=${HOST_VAR} or NAME=? to be prompted (repeatable)",
      collect,
    )
    .option("--backend <name>", "isolation backend (default: strongest that works)")
    .option("--allow-host-compat", "allow the host backend (no isolation)")
    .option("--vcpus <n>", "virtual CPUs (default 1)", wholeNumber("--vcpus"))
    .option("--memory <mib>", "memory limit in MiB (default 1024)", wholeNumber("--memory"))
    .option("--disk <mib>", "disk limit of the writable layers in MiB (default 10240)", wholeNumber("--disk"))
    .option(
      "--ttl <s>",
      "seconds of inactivity before the workspace is reaped (default 86400)",
      wholeNumber("--ttl"),
    )
    .option("--id-only", "print only the workspace id")
    .option("--json", "print the structured result")
    .action(async (env: string, o: Record<string, any>) => {
      // Imported here, not at the top: `workspace list` and `status` load this module too.
      const [{ parsePublish }, { parseSecretOptions }, { terminalSecretPrompt }] = await Promise.all([
        import("../../../core/network.js"),
        import("../../../core/secrets.js"),
        import("../../prompt.js"),
      ]);
      ctx.exitCode = await act(
        ctx.io,
        o,
        () =>
          ctx.engine().workspaces.create({
            environment: env,
            seed_path: o.seedPath,
            repo_url: o.repoUrl,
            repo_ref: o.repoRef,
            ...(o.name !== undefined ? { name: o.name } : {}),
            labels: keyValues(o.label, "--label"),
            ...(o.network ? { network_policy: o.network } : {}),
            ...(o.publish ? { published_ports: (o.publish as string[]).map(parsePublish) } : {}),
            env: keyValues(o.env, "--env"),
            secrets: parseSecretOptions(o.secret),
            ...(terminalSecretPrompt() ? { prompt_secret: terminalSecretPrompt()! } : {}),
            ...(o.backend ? { backend: backendName(o.backend)! } : {}),
            allow_host_compat: o.allowHostCompat === true,
            ...(o.vcpus ? { vcpus: o.vcpus } : {}),
            ...(o.memory ? { memory_mib: o.memory } : {}),
            ...(o.disk !== undefined ? { disk_mib: o.disk } : {}),
            ...(o.ttl ? { ttl_seconds: o.ttl } : {}),
            signal: ctx.signal,
          }),
        (w) => (o.idOnly ? w.workspace_id : renderWorkspace(w)),
      );
    });

  ctx
    .light(ws.command("list"))
    .description("list workspaces, most recent activity first")
    .option("--json", "print the structured result")
    .action(async (o: { json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        async () => {
          // The store alone when there is nothing to reap; the engine (which reaps) otherwise.
          const { listIfNothingToReap } = await import("../../../core/workspace-list.js");
          return (
            (await listIfNothingToReap({ env: ctx.io.env })) ?? (await ctx.loadEngine()).workspaces.list()
          );
        },
        (r) =>
          r.count === 0
            ? "no workspaces"
            : table(
                ["id", "name", "state", "env", "backend", "commands", "last activity"],
                r.workspaces.map((w) => [
                  w.workspace_id,
                  w.name ?? "-",
                  w.state,
                  w.environment,
                  w.backend,
                  String(w.command_count),
                  w.last_activity_at,
                ]),
              ),
      );
    });

  ws.command("status")
    .description("show one workspace")
    .argument("<id>", "workspace id or name")
    .option("--json", "print the structured result")
    .action(async (id: string, o: { json?: boolean }) => {
      ctx.exitCode = await act(ctx.io, o, () => ctx.engine().workspaces.status(id), renderWorkspace);
    });

  ws.command("update")
    .description("rename a workspace, change its labels or its network policy")
    .argument("<id>", "workspace id or name")
    .option("--name <name>", "new unique name")
    .option("--label <K=V>", "set a label (repeatable)", collect)
    .option("--clear-label <K>", "remove a label (repeatable)", collect)
    .option("--network <policy>", "new network policy, applied to the running workspace at once")
    .option("--json", "print the structured result")
    .action(
      async (
        id: string,
        o: { name?: string; label?: string[]; clearLabel?: string[]; network?: string; json?: boolean },
      ) => {
        ctx.exitCode = await act(
          ctx.io,
          o,
          () =>
            ctx.engine().workspaces.update(id, {
              ...(o.name !== undefined ? { name: o.name } : {}),
              ...(o.label ? { set_labels: keyValues(o.label, "--label") } : {}),
              ...(o.clearLabel ? { clear_labels: o.clearLabel } : {}),
              ...(o.network !== undefined ? { network_policy: o.network } : {}),
            }),
          renderWorkspace,
        );
      },
    );

  ws.command("delete")
    .description("delete a workspace: its sandbox, files and history")
    .argument("<id>", "workspace id or name")
    .option("--json", "print the structured result")
    .action(async (id: string, o: { json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => ctx.engine().workspaces.delete(id),
        (r) => `deleted ${r.workspace_id}`,
      );
    });

  ws.command("stop")
    .description("stop a workspace's sandbox; files are kept")
    .argument("<id>", "workspace id or name")
    .option("--json", "print the structured result")
    .action(async (id: string, o: { json?: boolean }) => {
      ctx.exitCode = await act(ctx.io, o, () => ctx.engine().workspaces.stop(id), renderWorkspace);
    });

  ws.command("start")
    .description("start a stopped workspace on its kept files")
    .argument("<id>", "workspace id or name")
    .option("--json", "print the structured result")
    .action(async (id: string, o: { json?: boolean }) => {
      ctx.exitCode = await act(ctx.io, o, () => ctx.engine().workspaces.start(id), renderWorkspace);
    });
}

/** "; left out: 3 ignored, 1 submodule" for a Git seed that skipped anything. */
function seedSkipped(skipped: object | undefined): string {
  const parts = Object.entries((skipped ?? {}) as Record<string, number>)
    .filter(([, n]) => n > 0)
    .map(([why, n]) => `${n} ${why}`);
  return parts.length > 0 ? `; left out: ${parts.join(", ")}` : "";
}
