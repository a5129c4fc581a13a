/**
 * The toolchain environments on bwrap: `python3 -m venv` and pip in debian:12-python,
 * `npm ci` in debian:12-node against the npm registry this machine is configured for
 * (through the workspace's egress proxy). Both environments are built once into the
 * shared cache (a first build takes a minute or two) and reused by every later run.
 */
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bwrapSkipReason, type Harness, openHarness, suiteTitle, writeTree } from "../helpers/sandbox.js";

const skip = bwrapSkipReason();

/** The host's npm registry and CA file (a TLS-inspecting gateway's CA lives there), never hard-coded. */
function npmConfig(key: string): string {
  try {
    return execFileSync("npm", ["config", "get", key], { encoding: "utf8" }).trim();
  } catch {
    return "";
  }
}

describe.skipIf(skip !== "")(suiteTitle("toolchain environments, on bwrap", skip), () => {
  let h: Harness;

  beforeAll(async () => {
    h = await openHarness("toolchains");
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("debian:12-python makes a virtualenv whose pip runs", async () => {
    const ws = await h.create({ environment: "debian:12-python" });
    const r = await h.pyro.execWorkspace(
      ws.workspace_id,
      "python3 -m venv /workspace/.venv && /workspace/.venv/bin/python -m pip --version && /workspace/.venv/bin/python -c 'import sys; print(sys.prefix)'",
    );
    expect(r.exit_code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^pip \d+/m);
    expect(r.stdout).toContain("/workspace/.venv");
  }, 600_000);

  it("debian:12-node runs npm ci with network egress", async () => {
    const registry = npmConfig("registry") || "https://registry.npmjs.org/";
    const cafile = npmConfig("cafile");
    const files: Record<string, string> = {
      "package.json": JSON.stringify({
        name: "demo",
        version: "1.0.0",
        private: true,
        dependencies: { ms: "2.1.3" },
      }),
      "index.js": "console.log(require('ms')(60000));\n",
    };
    const env: Record<string, string> = {
      npm_config_registry: registry,
      npm_config_update_notifier: "false",
    };
    if (cafile && cafile !== "null" && cafile !== "undefined") {
      files["host-ca.pem"] = readFileSync(cafile, "utf8");
      env.npm_config_cafile = "/workspace/host-ca.pem";
    }
    const seed = await h.tempDir("npm-project");
    await writeTree(seed, files);
    const ws = await h.create({
      environment: "debian:12-node",
      networkPolicy: "egress",
      seedPath: seed,
      env,
    });
    const r = await h.pyro.execWorkspace(
      ws.workspace_id,
      "node --version && npm install --package-lock-only --no-audit --no-fund && rm -rf node_modules && npm ci --no-audit --no-fund && node index.js",
      { timeoutSeconds: 600 },
    );
    expect(r.exit_code, `${r.stdout}\n${r.stderr}`).toBe(0);
    expect(r.stdout).toMatch(/^v\d+\./m);
    expect(r.stdout.trim().split("\n").at(-1)).toBe("1m");
  }, 600_000);
});
