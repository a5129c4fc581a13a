import { isAbsolute } from "node:path";
import { hostBinOverride } from "../core/config.js";
import { PyroError } from "../errors.js";
import { run } from "../util/run.js";
import { fileExists, isExecutable, resolveCommand } from "./files.js";
import type {
  ConnectResult,
  Detection,
  DisconnectResult,
  EntryRead,
  Host,
  HostCheck,
  HostContext,
  HostDriver,
  RepairResult,
  ServerEntry,
} from "./host.js";
import {
  launchCommand,
  normaliseServeOptions,
  parseLaunch,
  pyroBinPath,
  SERVER_NAME,
  type ServeOptions,
} from "./launch.js";
import { probeStart } from "./probe.js";

/** Builds a Host from a driver: the rules every host shares live here, once. */
export function defineHost(driver: HostDriver): Host {
  const host: Host = {
    name: driver.name,
    title: driver.title,
    detect: (ctx) => detectBinary(driver, ctx),
    readEntry: (ctx) => driver.readEntry(ctx),
    printConfig: (launch, ctx) => driver.printConfig(launch, ctx),
    connect: (ctx, launch, options) => connectHost(driver, ctx, launch, options),
    disconnect: (ctx) => disconnectHost(driver, ctx),
    check: (ctx, options) => checkHost(driver, ctx, options),
    repair: (ctx, options) => repairHost(driver, host, ctx, options),
  };
  return host;
}

/** Writes pyro's entry unless it is already what `launch` asks for, then proves it is there (and starts). */
async function connectHost(
  driver: HostDriver,
  ctx: HostContext,
  launch: Parameters<Host["connect"]>[1],
  options: Parameters<Host["connect"]>[2] = {},
): Promise<ConnectResult> {
  const read = await driver.readEntry(ctx);
  refuseUnparsable(driver, read);
  const desired = driver.desired(launch, read.entry);
  let action: ConnectResult["action"] = "unchanged";
  let method: ConnectResult["method"] = "none";
  if (!read.entry || !sameEntry(read.entry, desired)) {
    const detection = await detectBinary(driver, ctx, { version: false });
    method = await driver.writeEntry(ctx, desired, {
      binary: detection.installed ? detection.binary : null,
      existing: read.entry,
    });
    action = read.entry ? "updated" : "added";
    // Trust, but verify: the host CLI (or our edit) must have left exactly this entry.
    const after = await driver.readEntry(ctx);
    if (!after.entry || !sameEntry(after.entry, desired)) {
      throw new PyroError(
        "internal",
        `${driver.title}'s config at ${after.config_path} does not hold the pyro entry that was just written`,
        `add it by hand: pyro host print-config ${driver.name}`,
      );
    }
  }
  const result: ConnectResult = {
    host: driver.name,
    action,
    method,
    config_path: read.config_path,
    server_name: launch.server_name,
    command: desired.command,
    args: desired.args,
    starts: null,
  };
  if (options.verify !== false) {
    result.start = await probeStart(desired, ctx);
    result.starts = result.start.starts;
  }
  return result;
}

/** Removes pyro's entry (idempotent) and proves it is gone. */
async function disconnectHost(driver: HostDriver, ctx: HostContext): Promise<DisconnectResult> {
  const read = await driver.readEntry(ctx);
  refuseUnparsable(driver, read);
  const result: DisconnectResult = {
    host: driver.name,
    changed: false,
    method: "none",
    config_path: read.config_path,
    server_name: SERVER_NAME,
    notes: [...read.notes],
  };
  if (!read.entry) return result;
  const detection = await detectBinary(driver, ctx, { version: false });
  result.method = await driver.removeEntry(ctx, {
    binary: detection.installed ? detection.binary : null,
    existing: read.entry,
  });
  result.changed = true;
  const after = await driver.readEntry(ctx);
  if (after.entry) {
    throw new PyroError(
      "internal",
      `${driver.title}'s config at ${after.config_path} still holds a pyro entry after removing it`,
      `remove the ${SERVER_NAME} entry by hand`,
    );
  }
  return result;
}

/** Where the host stands: installed, configured, the entry's problems and whether it starts. */
async function checkHost(
  driver: HostDriver,
  ctx: HostContext,
  options: Parameters<Host["check"]>[1] = {},
): Promise<HostCheck> {
  const [detection, read] = await Promise.all([detectBinary(driver, ctx), driver.readEntry(ctx)]);
  const base = {
    host: driver.name,
    title: driver.title,
    installed: detection.installed,
    binary: detection.binary,
    version: detection.version,
    config_path: read.config_path,
    notes: [...read.notes],
    command: read.entry?.command ?? null,
    args: read.entry?.args ?? null,
  };
  if (detection.reason) base.notes.push(detection.reason);
  if (read.parse_error) {
    return {
      ...base,
      configured: false,
      status: "broken",
      problems: [`cannot parse ${read.config_path}: ${read.parse_error}`],
      starts: null,
      fix: `edit ${read.config_path} by hand until it parses (pyro does not rewrite a config it cannot parse)`,
    };
  }
  if (!read.entry)
    return {
      ...base,
      configured: false,
      status: "missing",
      problems: [],
      starts: null,
      fix: `pyro host connect ${driver.name}`,
    };
  const problems = await staticProblems(read.entry, driver, ctx, base.notes);
  const result: HostCheck = {
    ...base,
    configured: true,
    status: "ok",
    problems,
    starts: null,
    fix: null,
  };
  if (problems.length === 0 && options.probe !== false) {
    result.start = await probeStart(read.entry, ctx);
    result.starts = result.start.starts;
    if (!result.start.starts) problems.push(`pyro does not start: ${result.start.error ?? "unknown error"}`);
  }
  if (problems.length > 0) {
    result.status = "broken";
    result.fix = `pyro host repair ${driver.name}`;
  }
  return result;
}

/** Rewrites a broken entry, keeping the serve options it carried. */
async function repairHost(
  driver: HostDriver,
  host: Host,
  ctx: HostContext,
  options: Parameters<Host["repair"]>[1] = {},
): Promise<RepairResult> {
  const before = await host.check(ctx);
  if (before.status === "ok" && !options.force)
    return { host: driver.name, action: "none", before, after: before };
  const read = await driver.readEntry(ctx);
  refuseUnparsable(driver, read);
  const launch = (options.launch ?? ((o: ServeOptions) => launchCommand(o)))(
    repairOptions(read.entry, options.serve ?? {}, ctx.cwd),
  );
  await host.connect(ctx, launch, { verify: false });
  const after = await host.check(ctx);
  return { host: driver.name, action: "repaired", before, after };
}

/**
 * The serve options a repaired entry gets: the ones the old entry carried (so a repair
 * keeps `--profile workspace-full`), overridden by any given on the command line. Old
 * options that no longer validate are dropped: they may be why the entry broke.
 */
function repairOptions(entry: ServerEntry | null, given: ServeOptions, cwd: string): ServeOptions {
  const old = entry ? parseLaunch(entry.command, entry.args).options : {};
  const conflicting =
    given.mode !== undefined || given.profile !== undefined ? { mode: undefined, profile: undefined } : {};
  const seed =
    given.project_path !== undefined || given.repo_url !== undefined
      ? { project_path: undefined, repo_url: undefined, repo_ref: undefined }
      : {};
  try {
    return normaliseServeOptions({ ...old, ...conflicting, ...seed, ...stripUndefined(given) }, cwd);
  } catch {
    return normaliseServeOptions(given, cwd);
  }
}

function stripUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

function refuseUnparsable(driver: HostDriver, read: EntryRead): void {
  if (read.parse_error) {
    throw new PyroError(
      "conflict",
      `cannot parse ${read.config_path}: ${read.parse_error}`,
      `pyro never rewrites a config it cannot parse; fix the file, or add the entry by hand from \`pyro host print-config ${driver.name}\``,
    );
  }
}

/** Faults visible without starting anything; also adds notes about which pyro it runs. */
async function staticProblems(
  entry: ServerEntry,
  driver: HostDriver,
  ctx: HostContext,
  notes: string[],
): Promise<string[]> {
  const problems: string[] = [];
  // The host's own word for a server it starts itself ("stdio", OpenCode's "local").
  if (entry.type !== driver.entryType)
    problems.push(
      `the entry's type is '${entry.type}', not '${driver.entryType}' (a server the host starts)`,
    );
  if (!entry.enabled) problems.push("the entry is disabled");
  problems.push(...(driver.problems?.(entry) ?? []));
  if (!entry.command) {
    problems.push("the entry has no command");
    return problems;
  }
  if ((await resolveCommand(entry.command, ctx.env, ctx.cwd)) === null)
    problems.push(`command '${entry.command}' does not exist or is not executable`);
  const parsed = parseLaunch(entry.command, entry.args);
  if (!parsed.serves) problems.push("the entry does not run `pyro mcp serve`");
  if (parsed.launcher !== null) {
    if (isAbsolute(parsed.launcher) && !(await fileExists(parsed.launcher)))
      problems.push(`the pyro launcher ${parsed.launcher} does not exist`);
    else if (parsed.launcher !== pyroBinPath())
      notes.push(`the entry runs another pyro (${parsed.launcher}); this one is ${pyroBinPath()}`);
  }
  return problems;
}

/** Same launch and environment, enabled, same transport. */
export function sameEntry(a: ServerEntry, b: ServerEntry): boolean {
  return (
    a.type === b.type &&
    a.enabled === b.enabled &&
    a.command === b.command &&
    a.args.length === b.args.length &&
    a.args.every((x, i) => x === b.args[i]) &&
    JSON.stringify(sortKeys(a.env)) === JSON.stringify(sortKeys(b.env)) &&
    JSON.stringify(sortKeys(a.settings ?? {})) === JSON.stringify(sortKeys(b.settings ?? {}))
  );
}

function sortKeys<T>(o: Record<string, T>): Record<string, T> {
  return Object.fromEntries(Object.entries(o).sort(([x], [y]) => (x < y ? -1 : x > y ? 1 : 0)));
}

/**
 * Finds the host CLI: PYRO_<HOST>_BIN when set (it must then exist: a wrong override is
 * reported, not silently replaced by PATH), else the executable on PATH.
 */
export async function detectBinary(
  driver: HostDriver,
  ctx: HostContext,
  options: { version?: boolean } = {},
): Promise<Detection> {
  const override = hostBinOverride(ctx.env, driver.binEnvVar);
  let binary: string | null = null;
  let foundVia: Detection["found_via"] = null;
  if (override) {
    const resolved = await resolveCommand(override, ctx.env, ctx.cwd);
    if (!resolved)
      return {
        installed: false,
        binary: null,
        found_via: null,
        version: null,
        reason: `${driver.binEnvVar}=${override} is not an executable file`,
      };
    binary = resolved;
    foundVia = "env";
  } else {
    binary = await resolveCommand(driver.binaryName, ctx.env, ctx.cwd);
    if (binary) foundVia = "path";
  }
  if (!binary) return { installed: false, binary: null, found_via: null, version: null };
  let version: string | null = null;
  if (options.version !== false && (await isExecutable(binary))) {
    const r = await runHostCli(ctx, [binary, ...driver.versionArgs], { check: false, timeoutMs: 20_000 });
    if (r.exitCode === 0) version = r.stdout.split("\n")[0]?.trim() || null;
  }
  return { installed: true, binary, found_via: foundVia, version };
}

/**
 * Runs a host CLI (argv, no shell) in the context's environment. With `check` a non-zero
 * exit becomes a PyroError carrying the CLI's own last words.
 */
export async function runHostCli(
  ctx: HostContext,
  argv: string[],
  options: { check?: boolean; timeoutMs?: number; cwd?: string } = {},
): Promise<{ exitCode: number | null; stdout: string; stderr: string }> {
  const r = await run(argv, {
    env: ctx.env,
    cwd: options.cwd ?? ctx.cwd,
    timeoutMs: options.timeoutMs ?? ctx.timeoutMs ?? 30_000,
    ...(ctx.signal ? { signal: ctx.signal } : {}),
  });
  if (options.check !== false) {
    if (r.spawnError) throw new PyroError("not_found", `cannot run ${argv[0]}: ${r.spawnError.message}`);
    if (r.timedOut) throw new PyroError("timeout", `${argv.slice(0, 3).join(" ")} did not finish in time`);
    if (r.exitCode !== 0) {
      const said = `${r.stderr}\n${r.stdout}`
        .split("\n")
        .map((l) => l.trim())
        // Codex prints a Rust backtrace and start-up warnings around its error.
        .filter((l) => l && !/^\d+: /.test(l) && l !== "Stack backtrace:" && !/^WARNING:/.test(l))
        .slice(0, 2)
        .join(" / ");
      throw new PyroError(
        "internal",
        `\`${argv.slice(0, 3).join(" ")} ...\` failed (exit ${r.exitCode ?? r.signal})${said ? `: ${said}` : ""}`,
      );
    }
  }
  return { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr };
}
