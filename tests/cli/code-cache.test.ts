import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import {
  chmodSync,
  chownSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { PYRO_BIN, REPO_ROOT } from "../helpers/cli.js";

/**
 * The launcher's choice of what runs and its V8 code cache (bin/pyro.js, bin/code-cache.js):
 * `pyro run` runs the current build's CommonJS bundle with a cache, and never code other
 * than that build's: not a stale bundle, not a cache of other bytes (V8's own check is the
 * source's length alone), not a damaged cache. Checked on a copy of the launcher over a
 * small stand-in dist/ whose programs say which one ran.
 */
// A space in the path: the launcher turns file URLs into paths (a URL's pathname keeps %20).
const root = mkdtempSync(join(tmpdir(), "pyro code-cache-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const program = (what: string, cjs: boolean) =>
  cjs
    ? `exports.main = async (argv) => { process.stdout.write(${JSON.stringify(what)} + " " + argv.slice(2).join(" ") + "\\n"); return 3; };\n`
    : `export async function main(argv) { process.stdout.write(${JSON.stringify(what)} + " " + argv.slice(2).join(" ") + "\\n"); return 3; }\n`;

let n = 0;
/** A launcher copy over a stand-in dist/: the modules, the ES module bundle and main.cjs. */
function install(o: { stamp?: "current" | "stale"; cjs?: string | null } = {}): string {
  const dir = join(root, `repo${++n}`);
  mkdirSync(join(dir, "bin"), { recursive: true });
  mkdirSync(join(dir, "dist", "cli-bundle"), { recursive: true });
  mkdirSync(join(dir, "dist", "cli"), { recursive: true });
  writeFileSync(join(dir, "package.json"), '{"type":"module"}\n');
  for (const f of ["pyro.js", "code-cache.js"]) copyFileSync(join(REPO_ROOT, "bin", f), join(dir, "bin", f));
  writeFileSync(join(dir, "dist", "cli", "main.js"), program("modules", false));
  writeFileSync(join(dir, "dist", "cli-bundle", "main.js"), program("esm-bundle", false));
  if (o.cjs !== null)
    writeFileSync(join(dir, "dist", "cli-bundle", "main.cjs"), program(o.cjs ?? "cjs-bundle", true));
  restamp(dir, o.stamp === "stale" ? -1000 : 0);
  return dir;
}

/** The stamp as scripts/bundle-cli.mjs writes it for what dist/ holds now (`skew`: another build's time). */
function restamp(dir: string, skew = 0): void {
  const mtime = statSync(join(dir, "dist", "cli", "main.js")).mtimeMs;
  const cjs = join(dir, "dist", "cli-bundle", "main.cjs");
  const sha = existsSync(cjs) ? createHash("sha256").update(readFileSync(cjs)).digest("hex") : undefined;
  writeFileSync(
    join(dir, "dist", "cli-bundle", "stamp.json"),
    JSON.stringify({ main_mtime_ms: mtime + skew, cjs_sha256: sha }),
  );
}

function launch(dir: string, args: string[], nodeArgs: string[] = []) {
  const r = spawnSync(process.execPath, [...nodeArgs, join(dir, "bin", "pyro.js"), ...args], {
    env: { ...process.env, PYRO_HOME: join(dir, "home"), NODE_OPTIONS: "" },
    encoding: "utf8",
    timeout: 30_000,
  });
  return { code: r.status, out: r.stdout, err: r.stderr };
}

const cacheFiles = (dir: string) => {
  const d = join(dir, "home", "runtime", "cli-code");
  return existsSync(d) ? readdirSync(d).map((f) => join(d, f)) : [];
};

describe("the CLI launcher and its code cache", () => {
  it("runs `pyro run` from main.cjs, writes the cache once, then runs with it", () => {
    const dir = install();
    expect(launch(dir, ["run", "x"])).toMatchObject({ code: 3, out: "cjs-bundle run x\n" });
    const [cache, ...more] = cacheFiles(dir);
    expect(more).toEqual([]);
    expect(statSync(cache!).mode & 0o777).toBe(0o600);
    expect(statSync(join(dir, "home", "runtime", "cli-code")).mode & 0o777).toBe(0o700);
    const written = statSync(cache!).mtimeMs;
    expect(launch(dir, ["run", "y"])).toMatchObject({ code: 3, out: "cjs-bundle run y\n" });
    // Accepted, so not written again.
    expect(statSync(cache!).mtimeMs).toBe(written);
  });

  it("runs `pyro mcp serve` from main.cjs too (a rebuild under a live server cannot take its chunks)", () => {
    const dir = install();
    expect(launch(dir, ["mcp", "serve"])).toMatchObject({ code: 3, out: "cjs-bundle mcp serve\n" });
  });

  it("runs the other commands, and `pyro run` under node options, from the ES module bundle", () => {
    const dir = install();
    expect(launch(dir, ["--version"])).toMatchObject({ code: 3, out: "esm-bundle --version\n" });
    expect(launch(dir, ["mcp", "--help"])).toMatchObject({ code: 3, out: "esm-bundle mcp --help\n" });
    expect(launch(dir, ["run", "x"], ["--no-warnings"])).toMatchObject({
      code: 3,
      out: "esm-bundle run x\n",
    });
    expect(cacheFiles(dir)).toEqual([]);
  });

  it("never runs a stale bundle: with the stamp of another build, the modules run", () => {
    const dir = install({ stamp: "stale" });
    expect(launch(dir, ["run", "x"])).toMatchObject({ code: 3, out: "modules run x\n" });
    expect(cacheFiles(dir)).toEqual([]);
  });

  it("falls back to the ES module bundle when main.cjs cannot be loaded", () => {
    expect(launch(install({ cjs: null }), ["run", "x"])).toMatchObject({
      code: 3,
      out: "esm-bundle run x\n",
    });
    const broken = install();
    writeFileSync(join(broken, "dist", "cli-bundle", "main.cjs"), "exports.main = (;\n");
    restamp(broken);
    expect(launch(broken, ["run", "x"])).toMatchObject({ code: 3, out: "esm-bundle run x\n" });
  });

  it("runs the stamped bytes of main.cjs, not the cached code of old ones of the same length", () => {
    const dir = install({ cjs: "old-build" });
    expect(launch(dir, ["run", "x"]).out).toBe("old-build run x\n");
    expect(cacheFiles(dir)).toHaveLength(1);
    writeFileSync(join(dir, "dist", "cli-bundle", "main.cjs"), program("new-build", true));
    // Bytes other than the stamp's (another build's, written over this one): not run.
    expect(launch(dir, ["run", "x"]).out).toBe("esm-bundle run x\n");
    restamp(dir);
    expect(launch(dir, ["run", "x"]).out).toBe("new-build run x\n");
    // The old build's cache is removed when the new one is written.
    expect(cacheFiles(dir)).toHaveLength(1);
    expect(launch(dir, ["run", "x"]).out).toBe("new-build run x\n");
  });

  it("does not use a damaged cache, nor one another user owns or others can write, and writes a good one", () => {
    const dir = install();
    launch(dir, ["run", "x"]);
    const [cache] = cacheFiles(dir);
    const good = readFileSync(cache!);
    const damaged = Buffer.from(good);
    damaged[damaged.length - 100] ^= 0xff;
    writeFileSync(cache!, damaged);
    expect(launch(dir, ["run", "x"])).toMatchObject({ code: 3, out: "cjs-bundle run x\n" });
    // Written again, and that one is used (not written a third time).
    expect(readFileSync(cache!).equals(damaged)).toBe(false);
    const rewritten = statSync(cache!).mtimeMs;
    expect(launch(dir, ["run", "x"]).out).toBe("cjs-bundle run x\n");
    expect(statSync(cache!).mtimeMs).toBe(rewritten);
    chmodSync(cache!, 0o666);
    const before = statSync(cache!).mtimeMs;
    expect(launch(dir, ["run", "x"]).out).toBe("cjs-bundle run x\n");
    // Not used, so written again (0600).
    expect(statSync(cache!).mtimeMs).not.toBe(before);
    expect(statSync(cache!).mode & 0o777).toBe(0o600);
    if (process.getuid?.() === 0) {
      chownSync(cache!, 65534, 65534);
      expect(launch(dir, ["run", "x"]).out).toBe("cjs-bundle run x\n");
      expect(statSync(cache!).uid).toBe(0);
    }
  });
});

/** The real build: its main.cjs is what `pyro run` runs (bundle current), errors and all. */
const stampFile = join(REPO_ROOT, "dist", "cli-bundle", "stamp.json");
const bundleCurrent =
  existsSync(stampFile) &&
  JSON.parse(readFileSync(stampFile, "utf8")).main_mtime_ms ===
    statSync(join(REPO_ROOT, "dist", "cli", "main.js")).mtimeMs;
describe.skipIf(!bundleCurrent)(
  bundleCurrent
    ? "the built main.cjs"
    : "the built main.cjs (skipped: no current bundle; npm run build makes one)",
  () => {
    it("runs `pyro run` (a usage error here) as the modules do, and leaves its code cache", () => {
      const home = join(root, "real-home");
      const r = spawnSync(
        process.execPath,
        [PYRO_BIN, "run", "debian:12", "--backend", "nope", "--", "true"],
        {
          env: { ...process.env, PYRO_HOME: home, PYRO_DEBUG: "1" },
          encoding: "utf8",
          timeout: 60_000,
        },
      );
      expect(r.status).toBe(1);
      expect(r.stderr).toMatch(/^pyro: error \[invalid_argument\]: unknown backend 'nope'/);
      // The debug trace names the file that ran.
      expect(r.stderr).toContain("dist/cli-bundle/main.cjs");
      expect(readdirSync(join(home, "runtime", "cli-code"))).toHaveLength(1);
    });
  },
);
