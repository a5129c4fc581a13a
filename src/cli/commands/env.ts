import { createInterface } from "node:readline/promises";
import type { Command } from "commander";
import { buildRecipe } from "../../core/recipes.js";
import { checkRecipe, type EnvironmentSource } from "../../core/vocabulary.js";
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
    .description("list official, pulled and built environments, their cache status and sizes")
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
            ["name", "kind", "status", "size", "digest", "description"],
            r.environments.map((e) => [
              e.name,
              e.kind,
              e.status,
              e.size_bytes === null ? "-" : formatBytes(e.size_bytes),
              // The current version's (an image tag's latest pull); `env inspect` has it whole.
              e.digest ? e.digest.slice(0, "sha256:".length + 12) : "-",
              e.description,
            ]),
          ),
      );
    });

  env
    .command("pull")
    .description(
      "build an official environment or pull any OCI image (REGISTRY/PATH[:TAG][@DIGEST]) into the cache; a cached tag is re-resolved at the registry and pulled again only when it moved",
    )
    .argument("<env>", "environment name (debian:12) or image reference (docker.io/library/python:3.12)")
    .option("--insecure-registry", "plain HTTP to a registry on this machine (loopback addresses only)")
    .option("--json", "print the structured result")
    .action(async (name: string, opts: { json?: boolean; insecureRegistry?: boolean }) => {
      const progress = progressReporter(ctx.io, name);
      ctx.exitCode = await act(
        ctx.io,
        opts,
        async () => {
          try {
            return await ctx.engine().environments.pull(name, {
              onProgress: progress.update,
              signal: ctx.signal,
              refresh: true,
              ...(opts.insecureRegistry ? { insecureRegistry: true } : {}),
            });
          } finally {
            progress.done();
          }
        },
        (r) =>
          `${r.warning ? `warning: ${r.warning}\n` : ""}` +
          `${r.name}: ${r.built ? "built" : "already cached"} in ${(r.duration_ms / 1000).toFixed(1)}s, ${formatBytes(r.size_bytes)}` +
          `${r.package_count ? `, ${r.package_count} packages` : ""}${r.digest ? `\n  digest ${r.digest}` : ""}\n  ${r.path}`,
      );
    });

  env
    .command("build")
    .description(
      "build an environment from a recipe: a base plus apt packages, copied files and commands, run in a sandbox with network egress; cached by recipe",
    )
    .argument("<name>", "name of the built environment (lowercase, optional :TAG)")
    .requiredOption("--from <env>", "base environment: official, an image reference, or a built one")
    .option("--apt <pkg>", "Debian package to install (repeatable)", collect, [])
    .option("--run <cmd>", "shell command to run, in order (repeatable)", collect, [])
    .option("--copy <src:dest>", "host file or directory to copy in (repeatable)", collect, [])
    .option("--json", "print the structured result")
    .action(
      async (
        name: string,
        opts: { from: string; apt: string[]; run: string[]; copy: string[]; json?: boolean },
      ) => {
        const progress = progressReporter(ctx.io, name);
        ctx.exitCode = await act(
          ctx.io,
          opts,
          async () => {
            const recipe = checkRecipe(
              { name, from: opts.from, apt: opts.apt, run: opts.run, copy: opts.copy },
              process.cwd(),
            );
            try {
              return await buildRecipe(ctx.engine(), recipe, {
                on_progress: progress.update,
                signal: ctx.signal,
              });
            } finally {
              progress.done();
            }
          },
          (r) =>
            `${r.name}: ${r.cache_hit ? "cache hit" : "built"} in ${(r.duration_ms / 1000).toFixed(1)}s, ${formatBytes(r.size_bytes)}\n  ${r.path}`,
        );
      },
    );

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
            `kind:        ${r.kind}`,
            `source:      ${describeSource(r.source)}`,
            ...(r.digest ? [`digest:      ${r.digest}`] : []),
            `recipe key:  ${r.recipe_key}`,
            `status:      ${r.status}`,
            ...(r.manifest
              ? [
                  `path:        ${r.path}`,
                  `built at:    ${r.manifest.built_at} (${(r.manifest.build_duration_ms / 1000).toFixed(0)}s)`,
                  `size:        ${formatBytes(r.manifest.size_bytes)}, ${r.manifest.file_count} files, ${r.manifest.package_count ?? "?"} packages`,
                  ...imageLines(r.manifest.source_detail),
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
    .option("--all", "remove every cached environment no workspace uses (asks first on a terminal)")
    .option("--yes", "do not ask before --all")
    .option("--json", "print the structured result")
    .action(async (opts: { all?: boolean; json?: boolean; yes?: boolean }) => {
      if (opts.all && !opts.yes && ctx.io.stderrIsTTY && process.stdin.isTTY && !opts.json) {
        const envs = (await ctx.engine().environments.list()).filter((e) => e.status === "cached");
        const total = envs.reduce((a, e) => a + (e.size_bytes ?? 0), 0);
        const ok = await confirm(
          ctx.io,
          `remove ${envs.length} cached environment(s), ${formatBytes(total)} (those a workspace uses stay)? [y/N] `,
        );
        if (!ok) {
          ctx.io.stderr.write("nothing removed\n");
          ctx.exitCode = 1;
          return;
        }
      }
      ctx.exitCode = await act(
        ctx.io,
        opts,
        () => ctx.engine().environments.prune({ all: opts.all === true }),
        (r) =>
          [
            r.removed.length === 0
              ? "nothing to prune"
              : `${r.removed.map((x) => `removed ${x.path} (${x.reason})`).join("\n")}\nfreed ${formatBytes(r.freed_bytes)}`,
            ...(r.kept_in_use.length ? [`kept (a workspace uses them): ${r.kept_in_use.join(", ")}`] : []),
          ].join("\n"),
      );
    });
}

function describeSource(src: EnvironmentSource): string {
  switch (src.kind) {
    case "debootstrap":
      return `debootstrap ${src.suite} ${src.variant}${src.include.length ? ` + ${src.include.join(", ")}` : ""}`;
    case "oci":
      return `image ${src.reference}`;
    case "recipe":
      return `recipe from ${src.from}: ${src.apt.length} apt package(s), ${src.run.length} run step(s), ${src.copy.length} copy(ies)`;
  }
}

/** What an image pull recorded: digest, layers and the config fields that matter to commands. */
function imageLines(detail: Record<string, unknown>): string[] {
  if (typeof detail.digest !== "string") return [];
  const layers = Array.isArray(detail.layers) ? detail.layers.length : 0;
  const env = Array.isArray(detail.env) ? (detail.env as string[]) : [];
  return [
    `image:       ${String(detail.reference)} (${String(detail.platform)}, ${layers} layer(s))`,
    ...(detail.index_digest ? [`index:       ${String(detail.index_digest)}`] : []),
    ...(env.length ? [`env:         ${env.map((e) => e.split("=")[0]).join(", ")}`] : []),
    ...(detail.working_dir
      ? [`workdir:     ${String(detail.working_dir)} (commands run in /workspace)`]
      : []),
    ...(detail.user ? [`user:        ${String(detail.user)}`] : []),
  ];
}

async function confirm(io: { stderr: NodeJS.WritableStream }, question: string): Promise<boolean> {
  const rl = createInterface({ input: process.stdin, output: io.stderr });
  try {
    return /^y(es)?$/i.test((await rl.question(question)).trim());
  } finally {
    rl.close();
  }
}

function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}
