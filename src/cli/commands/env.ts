import type { Command } from "commander";
import { formatBytes } from "../../util/fs.js";
import type { CliContext } from "../main.js";
import { act, table } from "../output.js";
import { progressReporter } from "../progress.js";

export function registerEnv(program: Command, ctx: CliContext): void {
  const env = program
    .command("env")
    .description("manage cached environments (root filesystems workspaces start from)");

  env
    .command("list")
    .description("list the official environments and their cache status")
    .option("--json", "print the structured result")
    .action(async (opts: { json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        opts,
        async () => {
          const environments = await ctx.engine().environments.list();
          return { count: environments.length, environments };
        },
        (r) =>
          table(
            ["name", "status", "size", "description"],
            r.environments.map((e) => [
              e.name,
              e.status,
              e.size_bytes === null ? "-" : formatBytes(e.size_bytes),
              e.description,
            ]),
          ),
      );
    });

  env
    .command("pull")
    .description("build (or fetch) an environment into the cache; instant when already cached")
    .argument("<env>", "environment name, e.g. debian:12")
    .option("--json", "print the structured result")
    .action(async (name: string, opts: { json?: boolean }) => {
      const progress = progressReporter(ctx.io, name);
      ctx.exitCode = await act(
        ctx.io,
        opts,
        async () => {
          try {
            return await ctx
              .engine()
              .environments.pull(name, { onProgress: progress.update, signal: ctx.signal });
          } finally {
            progress.done();
          }
        },
        (r) =>
          `${r.name}: ${r.built ? "built" : "already cached"} in ${(r.duration_ms / 1000).toFixed(1)}s, ${formatBytes(r.size_bytes)}` +
          `${r.package_count ? `, ${r.package_count} packages` : ""}\n  ${r.path}`,
      );
    });

  env
    .command("inspect")
    .description("show an environment's recipe, cache status and manifest")
    .argument("<env>", "environment name")
    .option("--json", "print the structured result")
    .action(async (name: string, opts: { json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        opts,
        async () => {
          const engine = ctx.engine();
          const info = await engine.environments.info(name);
          const manifest = info.path ? await engine.environments.readManifest(info.path) : null;
          return { ...info, manifest };
        },
        (r) =>
          [
            `name:        ${r.name}`,
            `description: ${r.description}`,
            `source:      ${r.source.kind === "debootstrap" ? `debootstrap ${r.source.suite} ${r.source.variant}${r.source.include.length ? ` + ${r.source.include.join(", ")}` : ""}` : r.source.reference}`,
            `recipe key:  ${r.recipe_key}`,
            `status:      ${r.status}`,
            ...(r.manifest
              ? [
                  `path:        ${r.path}`,
                  `built at:    ${r.manifest.built_at} (${(r.manifest.build_duration_ms / 1000).toFixed(0)}s)`,
                  `size:        ${formatBytes(r.manifest.size_bytes)}, ${r.manifest.file_count} files, ${r.manifest.package_count ?? "?"} packages`,
                ]
              : []),
          ].join("\n"),
      );
    });

  env
    .command("prune")
    .description(
      "remove stale environment builds, leftovers of interrupted builds, and with --all everything",
    )
    .option("--all", "remove every cached environment")
    .option("--json", "print the structured result")
    .action(async (opts: { all?: boolean; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        opts,
        () => ctx.engine().environments.prune({ all: opts.all === true }),
        (r) =>
          r.removed.length === 0
            ? "nothing to prune"
            : `${r.removed.map((x) => `removed ${x.path} (${x.reason})`).join("\n")}\nfreed ${formatBytes(r.freed_bytes)}`,
      );
    });
}
