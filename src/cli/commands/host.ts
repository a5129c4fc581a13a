import type { Command } from "commander";
import { EXIT_FAILURE, EXIT_OK } from "../../errors.js";
import {
  allHosts,
  type ConnectResult,
  type DisconnectResult,
  getHost,
  type HostCheck,
  hostContext,
  launchCommand,
  normaliseServeOptions,
  printConfig,
  type RepairResult,
  type ServeOptions,
  type StartProbe,
  shellJoin,
} from "../../hosts/index.js";
import type { CliContext } from "../main.js";
import { act } from "../output.js";

interface ServeFlags {
  mode?: string;
  profile?: string;
  projectPath?: string;
  repoUrl?: string;
  repoRef?: string;
  allowHostCompat?: boolean;
  json?: boolean;
}

/** The `pyro mcp serve` flags a host entry can carry, shared by connect, repair and print-config. */
function serveFlags(cmd: Command): Command {
  return cmd
    .option("--mode <mode>", "serve a curated mode (repro-fix, inspect, cold-start, review-eval)")
    .option("--profile <profile>", "serve a profile (vm-run, workspace-core, workspace-full)")
    .option("--project-path <path>", "seed workspaces from this directory (for hosts that do not keep cwd)")
    .option("--repo-url <url>", "seed workspaces from a clean clone of this repository")
    .option("--repo-ref <ref>", "branch, tag or commit for --repo-url")
    .option("--allow-host-compat", "let pyro fall back to the unisolated host backend")
    .option("--json", "print the structured result");
}

function serveOptions(f: ServeFlags): ServeOptions {
  const o: ServeOptions = {};
  if (f.mode !== undefined) o.mode = f.mode;
  if (f.profile !== undefined) o.profile = f.profile;
  if (f.projectPath !== undefined) o.project_path = f.projectPath;
  if (f.repoUrl !== undefined) o.repo_url = f.repoUrl;
  if (f.repoRef !== undefined) o.repo_ref = f.repoRef;
  if (f.allowHostCompat) o.allow_host_compat = true;
  return o;
}

export function registerHost(program: Command, ctx: CliContext): void {
  const host = program
    .command("host")
    .description(
      "connect chat hosts (Claude Code, Codex, OpenCode) to pyro's MCP server, check them, or disconnect them",
    );
  const hctx = () => hostContext(ctx.io.env, { signal: ctx.signal });

  serveFlags(
    host
      .command("connect")
      .description("add pyro to a host's MCP servers (idempotent; other servers are left alone)")
      .argument("<host>", "claude-code, codex or opencode"),
  )
    .option("--no-verify", "do not start pyro once to prove the entry works")
    .action(async (name: string, opts: ServeFlags & { verify: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        opts,
        async () => {
          const h = getHost(name);
          const launch = launchCommand(normaliseServeOptions(serveOptions(opts)));
          return h.connect(hctx(), launch, { verify: opts.verify });
        },
        renderConnect,
        (r) => (r.starts === false ? EXIT_FAILURE : EXIT_OK),
      );
    });

  host
    .command("disconnect")
    .description("remove pyro from a host's MCP servers (idempotent; other servers are left alone)")
    .argument("<host>", "claude-code, codex or opencode")
    .option("--json", "print the structured result")
    .action(async (name: string, opts: { json?: boolean }) => {
      ctx.exitCode = await act(ctx.io, opts, () => getHost(name).disconnect(hctx()), renderDisconnect);
    });

  serveFlags(
    host
      .command("print-config")
      .description("print the config snippet that starts pyro, for copy-paste")
      .argument("<target>", "claude-code, codex, opencode or generic"),
  ).action(async (target: string, opts: ServeFlags) => {
    ctx.exitCode = await act(
      ctx.io,
      opts,
      async () => printConfig(target, launchCommand(normaliseServeOptions(serveOptions(opts))), hctx()),
      (r) => {
        // stdout stays a valid config file; the host-CLI alternative goes to stderr.
        if (r.cli_command) ctx.io.stderr.write(`# or run: ${shellJoin(r.cli_command)}\n`);
        return r.snippet;
      },
    );
  });

  host
    .command("doctor")
    .description("per host: installed? pyro configured? does pyro actually start?")
    .argument("[host]", "check only this host")
    .option("--no-start", "do not start pyro to prove each entry works")
    .option("--json", "print the structured result")
    .action(async (name: string | undefined, opts: { start: boolean; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        opts,
        async () => {
          const targets = name ? [getHost(name)] : allHosts();
          const c = hctx();
          const hosts = await Promise.all(targets.map((h) => h.check(c, { probe: opts.start })));
          return { hosts };
        },
        (r) => r.hosts.map(renderCheck).join("\n\n"),
      );
    });

  serveFlags(
    host
      .command("repair")
      .description("fix a missing or broken pyro entry (keeps the entry's serve options unless given)")
      .argument("<host>", "claude-code, codex or opencode"),
  )
    .option("--force", "rewrite the entry even when it looks healthy")
    .action(async (name: string, opts: ServeFlags & { force?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        opts,
        () => getHost(name).repair(hctx(), { serve: serveOptions(opts), force: opts.force === true }),
        renderRepair,
        (r) => (r.after.status === "ok" ? EXIT_OK : EXIT_FAILURE),
      );
    });
}

function describeStart(p: StartProbe | undefined, starts: boolean | null): string {
  if (starts === null || !p) return "not checked";
  const secs = `${(p.duration_ms / 1000).toFixed(1)}s`;
  if (!p.starts) return `no: ${p.error ?? "unknown error"}`;
  const who = p.server_name ? `${p.server_name} ${p.server_version ?? ""}`.trim() : "server";
  return `yes (${who}, ${p.tool_count ?? 0} tools, ${secs})`;
}

function renderConnect(r: ConnectResult): string {
  const how = r.method === "cli" ? " with the host's CLI" : r.method === "file" ? "" : "";
  const verb = r.action === "unchanged" ? "already connected" : `${r.action} '${r.server_name}'${how}`;
  const lines = [
    `${r.host}: ${verb} in ${r.config_path}`,
    `  command: ${shellJoin([r.command, ...r.args])}`,
    `  starts:  ${describeStart(r.start, r.starts)}`,
  ];
  if (r.starts === false)
    lines.push(`  the entry is written but pyro does not start; see \`pyro host doctor ${r.host}\``);
  return lines.join("\n");
}

function renderDisconnect(r: DisconnectResult): string {
  const how = r.method === "cli" ? " with the host's CLI" : "";
  const lines = [
    r.changed
      ? `${r.host}: removed '${r.server_name}'${how} from ${r.config_path}`
      : `${r.host}: not connected (no '${r.server_name}' entry in ${r.config_path})`,
    ...r.notes.map((n) => `  note: ${n}`),
  ];
  return lines.join("\n");
}

function renderCheck(c: HostCheck): string {
  const installed = c.installed ? `yes, ${c.binary}${c.version ? ` (${c.version})` : ""}` : "no";
  const configured =
    c.configured && c.command !== null ? `yes: ${shellJoin([c.command, ...(c.args ?? [])])}` : "no";
  const lines = [
    `${c.title} (${c.host}): ${c.status}`,
    `  installed:  ${installed}`,
    `  config:     ${c.config_path}`,
    `  configured: ${configured}`,
    `  starts:     ${describeStart(c.start, c.starts)}`,
    ...c.problems.map((p) => `  problem:    ${p}`),
    ...c.notes.map((n) => `  note:       ${n}`),
  ];
  if (c.fix) lines.push(`  fix:        ${c.fix}`);
  return lines.join("\n");
}

function renderRepair(r: RepairResult): string {
  if (r.action === "none")
    return `${r.host}: nothing to repair (${r.before.status}; use --force to rewrite anyway)`;
  const why = r.before.status === "missing" ? "missing" : `broken: ${r.before.problems.join("; ")}`;
  const lines = [`${r.host}: repaired (was ${why})`, renderCheck(r.after)];
  return lines.join("\n");
}
