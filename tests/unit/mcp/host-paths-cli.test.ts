import { existsSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pyro, REPO_ROOT } from "../../helpers/cli.js";
import { launchStdio } from "../../integration/mcp/helpers.js";

/**
 * `pyro mcp serve --allow-host-path DIR` as a host launches it (the built CLI over stdio).
 * No sandbox is needed: host paths are checked before the workspace is looked up, so an
 * accepted path reaches `workspace_not_found` and a refused one stops at
 * `path_outside_workspace`.
 */
const built = existsSync(join(REPO_ROOT, "dist", "cli", "main.js"));

describe.skipIf(!built)("pyro mcp serve --allow-host-path (built CLI; run `npm run build` first)", () => {
  let project: string;
  let outside: string;
  let home: string;
  beforeAll(async () => {
    project = await mkdtemp(join(tmpdir(), "pyro-mcp-cli-project-"));
    outside = await mkdtemp(join(tmpdir(), "pyro-mcp-cli-outside-"));
    home = await mkdtemp(join(tmpdir(), "pyro-mcp-cli-home-"));
    await writeFile(join(outside, "host-marker"), "canary\n");
  });
  afterAll(async () => {
    for (const d of [project, outside, home]) await rm(d, { recursive: true, force: true });
  });

  const push = async (args: string[]) => {
    const server = await launchStdio({ cwd: project, env: { PYRO_HOME: home }, args });
    try {
      const r = await server.call("workspace_sync_push", {
        workspace_id: "no-such-workspace",
        source_path: join(outside, "host-marker"),
      });
      return (r.structuredContent as { error: { code: string; hint?: string } }).error;
    } finally {
      await server.close();
    }
  };

  it("refuses a host path outside the directory it started in, naming that directory", async () => {
    const error = await push([]);
    expect(error.code).toBe("path_outside_workspace");
    expect(error.hint).toContain(project);
  });

  it("accepts a host path inside a directory given with --allow-host-path", async () => {
    expect((await push(["--allow-host-path", outside])).code).toBe("workspace_not_found");
  });

  it("refuses to start with an --allow-host-path that is not a directory", () => {
    const r = pyro(["mcp", "serve", "--allow-host-path", join(outside, "host-marker")], { PYRO_HOME: home });
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("invalid_argument");
    expect(r.stderr).toContain("is not a directory");
    expect(r.stderr).not.toMatch(/\n\s+at /);
  });
});
