import type { Command } from "commander";
import { runOnce } from "../../core/oneshot.js";
import { parseMaxOutputBytes } from "../../core/output.js";
import { backendName, collect, commandString, keyValues, positiveNumber, wholeNumber } from "../args.js";
import { liveCommand } from "../live.js";
import type { CliContext } from "../main.js";
import { act } from "../output.js";

interface RunFlags {
  vcpus?: number;
  memory?: number;
  disk?: number;
  timeout?: number;
  network?: string;
  backend?: string;
  allowHostCompat?: boolean;
  env?: string[];
  maxOutputBytes?: string;
  json?: boolean;
}

/**
 * `pyro run`, `pyro demo`, `pyro prepare`: the evaluator commands. The last two import
 * their module when they run: a `pyro run` loads no workspace loop (issue 18).
 */
export function registerRun(program: Command, ctx: CliContext): void {
  program
    .command("run")
    .description("one-shot: create a workspace, run one command, capture its output, destroy it")
    .argument("<env>", "environment, e.g. debian:12")
    .argument("[command...]", "command after --: one shell string, or an argv")
    .option("--vcpus <n>", "virtual CPUs (default 1)", wholeNumber("--vcpus"))
    .option("--memory <mib>", "memory limit in MiB (default 1024)", wholeNumber("--memory"))
    .option("--disk <mib>", "disk limit of the writable layer in MiB (default 10240)", wholeNumber("--disk"))
    .option("--timeout <s>", "command timeout in seconds (default 300)", positiveNumber("--timeout"))
    .option(
      "--network <policy>",
      "network policy: off (default), egress or allowlist:HOST[,HOST...] (docs/network.md)",
    )
    .option("--backend <name>", "isolation backend (default: strongest that works)")
    .option("--allow-host-compat", "allow running without isolation when no sandbox works")
    .option("--env <K=V>", "environment variable for the command (repeatable)", collect)
    .option(
      "--max-output-bytes <n>",
      "per stream (default 1MiB, 1k..4MiB); past it a stream keeps its head and tail",
    )
    .option("--json", "print the structured result")
    .action(async (env: string, command: string[], opts: RunFlags) => {
      const live = liveCommand(ctx.io, opts.json === true);
      ctx.exitCode = await act(
        ctx.io,
        opts,
        async () =>
          runOnce(
            ctx.engine(),
            commandString(command),
            {
              ...(live.on_output ? { on_output: live.on_output } : {}),
              ...(live.stdin ? { stdin: live.stdin } : {}),
              ...(opts.maxOutputBytes !== undefined
                ? { max_output_bytes: parseMaxOutputBytes(opts.maxOutputBytes) }
                : {}),
              environment: env,
              ...(opts.vcpus ? { vcpus: opts.vcpus } : {}),
              ...(opts.memory ? { memory_mib: opts.memory } : {}),
              ...(opts.disk !== undefined ? { disk_mib: opts.disk } : {}),
              ...(opts.timeout ? { timeout_seconds: opts.timeout } : {}),
              ...(opts.network ? { network_policy: opts.network } : {}),
              ...(opts.backend ? { backend: backendName(opts.backend)! } : {}),
              ...(opts.env ? { env: keyValues(opts.env, "--env") } : {}),
              allow_host_compat: opts.allowHostCompat === true,
              signal: ctx.signal,
            },
            // The process exits after the answer: the run's leftovers go to a detached cleaner.
            { detachCleanup: true },
          ).finally(live.done),
        (r) => {
          // Human mode: the command's own streams were written live, as if it ran here.
          if (r.timed_out) ctx.io.stderr.write(`pyro: command timed out\n`);
          if (r.execution_mode === "host_compat")
            ctx.io.stderr.write("pyro: warning: ran on the host without isolation (host_compat)\n");
          return "";
        },
        (r) => (r.timed_out ? 124 : r.exit_code),
      );
    });

  program
    .command("demo")
    .description("prove the one-shot lifecycle end to end on debian:12")
    .option("--backend <name>", "isolation backend")
    .option("--allow-host-compat", "allow running without isolation when no sandbox works")
    .option("--json", "print the structured result")
    .action(async (opts: { backend?: string; allowHostCompat?: boolean; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        opts,
        async () =>
          (await import("../../core/demo.js")).demo(ctx.engine(), {
            ...(opts.backend ? { backend: backendName(opts.backend)! } : {}),
            allow_host_compat: opts.allowHostCompat === true,
          }),
        (r) =>
          [
            `demo on backend ${r.backend} (${r.execution_mode}): ${r.ok ? "ok" : "FAILED"}`,
            ...r.steps.map(
              (s) =>
                `  ${s.ok ? "ok  " : "FAIL"} ${s.step.padEnd(12)} ${String(s.duration_ms).padStart(6)} ms  ${s.detail}`,
            ),
          ].join("\n"),
        (r) => (r.ok ? 0 : 1),
      );
    });

  program
    .command("prepare")
    .description("make an environment warm: cache it and prove create/exec/reset/delete once")
    .argument("<env>", "environment, e.g. debian:12")
    .option("--backend <name>", "isolation backend")
    .option("--allow-host-compat", "allow running without isolation when no sandbox works")
    .option("--force", "prove the loop again even when nothing changed")
    .option("--json", "print the structured result")
    .action(
      async (
        env: string,
        opts: { backend?: string; allowHostCompat?: boolean; force?: boolean; json?: boolean },
      ) => {
        ctx.exitCode = await act(
          ctx.io,
          opts,
          async () =>
            (await import("../../core/demo.js")).prepare(ctx.engine(), env, {
              ...(opts.backend ? { backend: backendName(opts.backend)! } : {}),
              allow_host_compat: opts.allowHostCompat === true,
              force: opts.force === true,
            }),
          (r) =>
            r.reused
              ? `${r.environment} is warm on ${r.backend} (prepared ${r.prepared_at}; nothing changed)`
              : `${r.environment} is warm on ${r.backend}: ${Object.entries(
                  r.timings as Record<string, number>,
                )
                  .map(([k, v]) => `${k.replace(/_ms$/, "")} ${v} ms`)
                  .join(", ")}`,
        );
      },
    );
}
