import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { request } from "node:https";
import { tmpdir } from "node:os";
import { basename, dirname, join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Pyro } from "../../../src/sdk/pyro.js";
import { isRoot } from "../../helpers/cli.js";
import { ENV_CACHE, envCacheSkipReason, onPath } from "../../helpers/sandbox.js";

/**
 * A real install through the egress proxy: `npm install` of one small package inside a
 * bwrap workspace with `--network egress`, from the registry this machine is configured
 * for (read from `npm config get registry`, never written here), with nothing but the
 * proxy variables pyro sets. The workspace's npm is the host's own npm package pushed in
 * (debian:12 has none), run by the sandbox's Node.
 */

function registry(): string {
  try {
    return execFileSync("npm", ["config", "get", "registry"], { encoding: "utf8" }).trim();
  } catch {
    return "";
  }
}

/** The host's npm package directory (…/node_modules/npm), from the npm on PATH. */
function npmDir(): string | null {
  try {
    const bin = execFileSync(
      "readlink",
      ["-f", execFileSync("which", ["npm"], { encoding: "utf8" }).trim()],
      {
        encoding: "utf8",
      },
    ).trim();
    const dir = dirname(dirname(bin));
    return existsSync(join(dir, "bin", "npm-cli.js")) ? dir : null;
  } catch {
    return null;
  }
}

/**
 * The trust anchors this machine's npm uses (npm's `cafile`, else NODE_EXTRA_CA_CERTS):
 * where the registry is reached through a TLS-inspecting gateway, its CA is there, and
 * the workspace's npm needs it as the host's does.
 */
function caFile(): string | null {
  try {
    const c = execFileSync("npm", ["config", "get", "cafile"], { encoding: "utf8" }).trim();
    if (c && c !== "null" && c !== "undefined" && existsSync(c)) return c;
  } catch {}
  const e = process.env.NODE_EXTRA_CA_CERTS;
  return e && existsSync(e) ? e : null;
}

/** Whether the registry answers from the host (a quick GET of one package's metadata). */
function reachable(url: string): Promise<boolean> {
  return new Promise((resolve) => {
    const req = request(new URL("is-number", url), { method: "GET", timeout: 8000 }, (res) => {
      res.resume();
      resolve((res.statusCode ?? 0) < 500);
    });
    req.on("timeout", () => req.destroy());
    req.on("error", () => resolve(false));
    req.end();
  });
}

const REGISTRY = registry();
const NPM = npmDir();
let skip = !isRoot
  ? "needs root (bwrap)"
  : !onPath("bwrap")
    ? "bubblewrap is not installed"
    : envCacheSkipReason() ||
      (!REGISTRY.startsWith("https://") && !REGISTRY.startsWith("http://")
        ? `npm has no registry configured (${REGISTRY || "none"})`
        : !NPM
          ? "no npm package on this host to push into the workspace"
          : "");

describe("npm install through the egress proxy", () => {
  let home: string;
  let pyro: Pyro;
  beforeAll(async () => {
    if (!skip && !(await reachable(REGISTRY)))
      skip = `the configured npm registry does not answer from this host`;
    home = await mkdtemp(join(tmpdir(), "pyro-npm-"));
    pyro = new Pyro({ home, environmentsDir: ENV_CACHE });
  });
  afterAll(async () => {
    for (const w of (await pyro.listWorkspaces()).workspaces) await pyro.deleteWorkspace(w.workspace_id);
    await pyro.close();
    await rm(home, { recursive: true, force: true });
  });

  it("installs is-number with npm in an egress workspace, through the proxy only", {
    timeout: 240_000,
  }, async (t) => {
    if (skip) t.skip(skip);
    const w = await pyro.createWorkspace({ backend: "bwrap", networkPolicy: "egress" });
    const id = w.workspace_id;
    await pyro.syncPushWorkspace(id, NPM!, { dest: "/workspace/.npm-cli" });
    const ca = caFile();
    if (ca) await pyro.syncPushWorkspace(id, ca, { dest: "/workspace/.ca" });
    const env = ca ? { NODE_EXTRA_CA_CERTS: `/workspace/.ca/${basename(ca)}` } : {};
    await pyro.writeWorkspaceFile(
      id,
      "app/package.json",
      '{"name":"app","version":"1.0.0","private":true}\n',
    );
    const r = await pyro.execWorkspace(
      id,
      `cd app && /run/pyro/runtime/bin/node /workspace/.npm-cli/bin/npm-cli.js install is-number@7.0.0 --registry '${REGISTRY}' --no-audit --no-fund --loglevel=error`,
      { timeoutSeconds: 180, env },
    );
    expect(r.exit_code, r.stderr).toBe(0);
    const installed = await pyro.readWorkspaceFile(id, "app/node_modules/is-number/package.json");
    expect(JSON.parse(installed.content).version).toBe("7.0.0");
    // Nothing refused on the way: the registry is a public destination.
    expect((await pyro.networkBlocks(id)).count).toBe(0);
    // The same install with the network off fails: there is no other route.
    await pyro.updateWorkspace(id, { networkPolicy: "off" });
    const off = await pyro.execWorkspace(
      id,
      `cd app && rm -rf node_modules && /run/pyro/runtime/bin/node /workspace/.npm-cli/bin/npm-cli.js install is-number@7.0.0 --registry '${REGISTRY}' --no-audit --no-fund --fetch-retries=0 --cache /tmp/empty-npm-cache --loglevel=error`,
      { timeoutSeconds: 120, env },
    );
    expect(off.exit_code).not.toBe(0);
  });
});
