import type { Command } from "commander";
import { type DoctorReport, doctor } from "../../core/doctor.js";
import { formatBytes } from "../../util/fs.js";
import type { CliContext } from "../main.js";
import { act, table } from "../output.js";

export function registerDoctor(program: Command, ctx: CliContext): void {
  program
    .command("doctor")
    .description("report which backends work on this host and why the others don't")
    .option("--environment <env>", "also give a warm / cold / stale verdict for this environment")
    .option("--json", "print the structured result")
    .action(async (opts: { environment?: string; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        opts,
        () => doctor(ctx.engine(), opts.environment ? { environment: opts.environment } : {}),
        renderDoctor,
      );
    });
}

export function renderDoctor(r: DoctorReport): string {
  const lines: string[] = [];
  lines.push(
    `platform: ${r.platform.os}/${r.platform.arch} kernel ${r.platform.kernel}, node ${r.platform.node}${r.platform.root ? ", root" : ""}`,
  );
  lines.push(`kvm: ${r.kvm.usable ? "usable" : `not usable (${r.kvm.reason})`}`);
  lines.push("");
  lines.push(
    table(
      ["backend", "available", "version", "notes"],
      r.backends.map((b) => [
        `${b.default ? "*" : " "}${b.name}`,
        b.available ? (b.opt_in ? "opt-in" : "yes") : "no",
        b.version ?? "-",
        [b.implemented ? "" : "not implemented yet", b.reason ?? ""].filter(Boolean).join("; "),
      ]),
    ),
  );
  lines.push("");
  lines.push(`default backend: ${r.default_backend ?? "none"} (${r.default_reason})`);
  lines.push(
    `network: proxy ${r.network.proxy.ok ? "ok" : `NOT working (${r.network.proxy.reason}): only --network off`}`,
  );
  for (const [name, n] of Object.entries(r.network.backends))
    lines.push(
      `  ${name.padEnd(12)} ${n.policies.join(", ")}${n.published_ports ? " + published ports" : ""}; ${n.channel}`,
    );
  lines.push("disk limit:");
  for (const [name, line] of Object.entries(r.disk_limit)) lines.push(`  ${name.padEnd(12)} ${line}`);
  const stale = r.pool.spares.filter((s) => !s.owner_alive).length;
  lines.push(
    `pool: ${r.pool.serve_size} started sandbox(es) per environment for \`pyro mcp serve\`, ${r.pool.size} here; ${r.pool.spares.length} spare(s) on disk${stale ? ` (${stale} of a process that is gone: the next pool ends them)` : ""}`,
  );
  lines.push(`cache: ${r.cache.path} (${formatBytes(r.cache.size_bytes)})`);
  for (const e of r.cache.environments) lines.push(`  ${e.name.padEnd(16)} ${e.status}`);
  if (r.environment)
    lines.push(`environment ${r.environment.name}: ${r.environment.readiness} (${r.environment.reason})`);
  return lines.join("\n");
}
