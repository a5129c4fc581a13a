import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, utimesSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { PYRO_BIN, REPO_ROOT } from "../helpers/cli.js";
import { bwrapSkipReason, ENV_CACHE } from "../helpers/sandbox.js";

/**
 * What a CLI start loads (issue 18: a CLI that starts like node). Each command runs as a
 * real process of the built CLI with a preload that records every module it loads; a
 * command that needs no backend must not load one (nor the Docker client, nor the
 * terminal emulator), and `--version` loads nothing from node_modules.
 */
const home = mkdtempSync(join(tmpdir(), "pyro-startup-"));
afterAll(() => rmSync(home, { recursive: true, force: true }));

function loads(
  args: string[],
  env: NodeJS.ProcessEnv = {},
): { code: number | null; files: string[]; bundled: boolean } {
  const out = join(home, `loads-${args.join("-").replace(/\W/g, "_")}.txt`);
  rmSync(out, { force: true });
  const r = spawnSync(
    process.execPath,
    ["--import", join(REPO_ROOT, "tests/helpers/record-loads.mjs"), PYRO_BIN, ...args],
    {
      env: { ...process.env, PYRO_HOME: home, PYRO_DEBUG: "", RECORD_LOADS_OUT: out, ...env },
      encoding: "utf8",
      timeout: 60_000,
    },
  );
  const files = readFileSync(out, "utf8")
    .split("\n")
    .filter(Boolean)
    .map((l) => l.replace(/^(esm|cjs) (file:\/\/)?/, ""));
  return {
    code: r.status,
    files: files.flatMap(unbundled),
    bundled: files.some((f) => f.startsWith(BUNDLE)),
  };
}

/**
 * The CLI runs from its bundle (scripts/bundle-cli.mjs) when it is current: a file of
 * the bundle stands for the modules in it (its meta.json), so the checks below judge
 * what the code loaded, bundled or not.
 */
const BUNDLE = join(REPO_ROOT, "dist", "cli-bundle/");
const bundleMeta = (): Record<string, string[]> =>
  existsSync(join(BUNDLE, "meta.json")) ? JSON.parse(readFileSync(join(BUNDLE, "meta.json"), "utf8")) : {};
let meta: Record<string, string[]> | undefined;
function unbundled(file: string): string[] {
  if (!file.startsWith(BUNDLE)) return [file];
  meta ??= bundleMeta();
  const inputs = meta[file.slice(REPO_ROOT.length)];
  if (!inputs) throw new Error(`${file} is not in the bundle's meta.json: rebuild (npm run build)`);
  return inputs.map((i) => join(REPO_ROOT, i));
}

/** A backend implementation (not its probe), the Docker client and what it pulls in, xterm. */
const HEAVY =
  /dist\/backends\/(bwrap|docker|firecracker|gvisor|host|qemu|vm)\/(?!probe\.js$|platform\.js$)|node_modules\/(dockerode|docker-modem|ssh2|@grpc|protobufjs|@xterm)\//;

/**
 * What `pyro workspace list` may load (paths under the repository; node: built-ins too).
 * A module added here is start-up time a user pays on every list (issue 18).
 */
const LIST_MAY_LOAD = new RegExp(
  `^(${[
    "node:.*",
    "bin/pyro\\.js",
    "dist/(errors|names|agent/errors)\\.js",
    "dist/cli/(main|output|args|commands/workspace/(index|lifecycle))\\.js",
    "dist/core/(config|workspace-list|list-item)\\.js",
    "dist/state/[a-z-]+\\.js",
    "dist/util/fs\\.js",
    "node_modules/(commander|better-sqlite3|bindings|file-uri-to-path)/.*",
  ].join("|")})$`,
);

describe("CLI start-up loads only what the command needs", () => {
  it("the recorder sees ES modules and CommonJS files (the checks below are not vacuous)", () => {
    const { files, bundled } = loads(["workspace", "status", "nope"]);
    // A current bundle is what runs (npm run build makes one; a tsc-only build has none).
    const stamp = join(BUNDLE, "stamp.json");
    const current =
      existsSync(stamp) &&
      JSON.parse(readFileSync(stamp, "utf8")).main_mtime_ms ===
        statSync(join(REPO_ROOT, "dist/cli/main.js")).mtimeMs;
    expect(bundled).toBe(current);
    expect(files.some((f) => f.endsWith("/dist/core/engine.js"))).toBe(true);
    expect(files.some((f) => f.includes("/node_modules/commander/lib/"))).toBe(true);
    // The pattern matches what the engine loaded before backends were lazy.
    expect(HEAVY.test(`${REPO_ROOT}dist/backends/qemu/backend.js`)).toBe(true);
    expect(HEAVY.test(`${REPO_ROOT}node_modules/dockerode/lib/docker.js`)).toBe(true);
    expect(HEAVY.test(`${REPO_ROOT}dist/backends/bwrap/probe.js`)).toBe(false);
  });

  for (const args of [
    ["workspace", "list"],
    ["workspace", "status", "nope"],
    ["env", "list"],
  ]) {
    it(`\`pyro ${args.join(" ")}\` loads no backend implementation, Docker client or terminal emulator`, () => {
      const { files } = loads(args);
      expect(files.filter((f) => HEAVY.test(f))).toEqual([]);
    });
  }

  it("`pyro workspace list` loads only the CLI's frame, the config and the state store", () => {
    const { code, files } = loads(["workspace", "list"]);
    expect(code).toBe(0);
    expect(files.some((f) => f.endsWith("/dist/state/store.js"))).toBe(true);
    // Not the engine, the workspace service, zod, the agent client or the other
    // subcommands' modules: with an empty home there is nothing to reap, so the list is
    // the store's rows (core/workspace-list.ts).
    expect(files.filter((f) => !LIST_MAY_LOAD.test(f.replace(REPO_ROOT, "")))).toEqual([]);
    expect(LIST_MAY_LOAD.test("dist/core/engine.js")).toBe(false);
    expect(LIST_MAY_LOAD.test("node_modules/zod/v4/classic/schemas.js")).toBe(false);
  });

  // A one-shot run is the sandbox's own start plus what it takes to get there (issue 18's
  // `pyro run` row): no zod, no agent client (its schemas), no state store, no image client
  // or tar, no network proxy, no workspace loop, and of the backend only its one-shot runner.
  const RUN_MUST_NOT_LOAD =
    /node_modules\/(zod|better-sqlite3|tar|smol-toml|ipaddr\.js)\/|dist\/(agent\/(client|messages|op-schemas)|env\/oci\/(builder|registry|apply|auth|follow)|net\/(proxy|socks|http-proxy|gate)|core\/(exec|files|snapshots|demo|recipes|netd)|backends\/(bwrap\/(backend|reset|pool)|docker\/probe|sandbox-state))\.js/;
  it.skipIf(bwrapSkipReason() !== "")(
    `\`pyro run debian:12 --backend bwrap -- true\` loads the one-shot path and nothing else${bwrapSkipReason() ? ` (skipped: ${bwrapSkipReason()})` : ""}`,
    () => {
      const { code, files } = loads(["run", "debian:12", "--backend", "bwrap", "--", "true"], {
        PYRO_ENV_CACHE: ENV_CACHE,
      });
      expect(code).toBe(0);
      expect(files.some((f) => f.endsWith("/dist/backends/bwrap/oneshot.js"))).toBe(true);
      expect(files.filter((f) => RUN_MUST_NOT_LOAD.test(f))).toEqual([]);
      expect(RUN_MUST_NOT_LOAD.test("node_modules/zod/v4/core/schemas.js")).toBe(true);
      expect(RUN_MUST_NOT_LOAD.test("dist/backends/bwrap/backend.js")).toBe(true);
      // Docker's probe (it loads node:http) only when Docker is probed.
      expect(RUN_MUST_NOT_LOAD.test("dist/backends/docker/probe.js")).toBe(true);
    },
  );

  it("`pyro --version` loads nothing from node_modules (no commander, no zod)", () => {
    const { code, files } = loads(["--version"]);
    expect(code).toBe(0);
    expect(files.filter((f) => f.includes("/node_modules/"))).toEqual([]);
  });
});

/**
 * Every file of the CLI bundle loads: a `require` esbuild could not follow (a UMD
 * module's relative require, say) is left to run time, where it resolves against
 * dist/cli-bundle/ and fails, and only when a command imports that chunk (the chunk of
 * `pyro host` did: jsonc-parser's `require("./impl/format")`).
 */
const bundleCurrent = (): boolean => {
  const stamp = join(BUNDLE, "stamp.json");
  return (
    existsSync(stamp) &&
    JSON.parse(readFileSync(stamp, "utf8")).main_mtime_ms ===
      statSync(join(REPO_ROOT, "dist/cli/main.js")).mtimeMs
  );
};
const current = bundleCurrent();
describe.skipIf(!current)(
  current ? "the CLI bundle" : "the CLI bundle (skipped: no current bundle; npm run build makes one)",
  () => {
    it("loads every one of its files", () => {
      const script = [
        'import { readdirSync } from "node:fs";',
        `const dir = ${JSON.stringify(BUNDLE)};`,
        "const bad = [];",
        'for (const f of readdirSync(dir).filter((f) => f.endsWith(".js")).sort()) {',
        "  try { await import(dir + f); } catch (e) { bad.push(f + ': ' + String(e.message).split('\\n')[0]); }",
        "}",
        "console.log(JSON.stringify(bad));",
      ].join("\n");
      const r = spawnSync(process.execPath, ["--input-type=module", "-e", script], {
        env: { ...process.env, PYRO_HOME: home, PYRO_DEBUG: "" },
        encoding: "utf8",
        timeout: 60_000,
      });
      expect(r.status, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout.trim().split("\n").at(-1) ?? "null")).toEqual([]);
    });

    it("runs `pyro host print-config` (a command whose chunk bundles a CommonJS dependency)", () => {
      const r = spawnSync(process.execPath, [PYRO_BIN, "host", "print-config", "generic", "--json"], {
        env: { ...process.env, PYRO_HOME: home, PYRO_DEBUG: "" },
        encoding: "utf8",
        timeout: 60_000,
      });
      expect(r.status, r.stderr).toBe(0);
      expect(r.stdout).toContain("mcp");
    });
  },
);

/**
 * A bundle made while dist/ changes (another tsc in the same checkout) is not stamped,
 * so bin/pyro.js runs the modules rather than a mix of old and new ones. Simulated by an
 * input of the bundle written "during" the build (its modification time in the future);
 * a current bundle is made again afterwards.
 */
describe.skipIf(!current)(
  current ? "bundling" : "bundling (skipped: no current bundle to make again; npm run build makes one)",
  () => {
    const bundle = () =>
      spawnSync(process.execPath, [join(REPO_ROOT, "scripts/bundle-cli.mjs")], {
        encoding: "utf8",
        timeout: 120_000,
      });
    it("stamps no bundle whose inputs changed while it was made", () => {
      const input = join(REPO_ROOT, "dist/errors.js");
      const { atime, mtime } = statSync(input);
      try {
        utimesSync(input, atime, new Date(Date.now() + 60_000));
        const r = bundle();
        expect(r.status, r.stderr).toBe(1);
        expect(r.stderr).toContain("dist/errors.js");
        expect(existsSync(join(BUNDLE, "stamp.json"))).toBe(false);
      } finally {
        utimesSync(input, atime, mtime);
        const again = bundle();
        expect(again.status, again.stderr).toBe(0);
      }
      expect(bundleCurrent()).toBe(true);
    });
  },
);
