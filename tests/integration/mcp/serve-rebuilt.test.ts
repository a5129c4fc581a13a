import { execFileSync } from "node:child_process";
import { rm, symlink } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { REPO_ROOT } from "../../helpers/cli.js";
import { bwrapSkipReason, type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";
import { launchStdio, type StdioServer } from "./helpers.js";

/**
 * A running `pyro mcp serve` whose install is rebuilt or upgraded under it: the CLI
 * bundle's files are replaced (here: gone), yet its tools go on working, because the
 * server runs the bundle's one-file form, read whole at its start (bin/pyro.js). From the
 * ES module bundle, the next call that needed a chunk not loaded yet failed ("Cannot find
 * module"). The modules the bundle is made of go too (the backends'), so a server that ran
 * them instead of the bundle fails here as well. The install is a copy of this checkout's.
 */
const skip = bwrapSkipReason();

describe.skipIf(skip !== "")(suiteTitle("pyro mcp serve with its install replaced under it", skip), () => {
  let h: Harness;
  let app: string;
  let server: StdioServer;

  beforeAll(async () => {
    h = await openHarness("mcp-rebuilt");
    app = await h.tempDir("app");
    // GNU cp -a keeps modification times to the nanosecond (Node's cp rounds them to the
    // millisecond): the bundle's stamp still names dist/cli/main.js's build.
    for (const part of ["bin", "dist", "package.json"])
      execFileSync("cp", ["-a", join(REPO_ROOT, part), app]);
    await symlink(join(REPO_ROOT, "node_modules"), join(app, "node_modules"));
    const cwd = await h.tempDir("project");
    server = await launchStdio({
      cwd,
      env: { ...h.cliEnv, PYRO_POOL: "0" },
      bin: join(app, "bin", "pyro.js"),
    });
  });
  afterAll(async () => {
    await server?.close();
    await h?.cleanup();
  });

  it("keeps serving its tools after its bundle's files are gone", async () => {
    await rm(join(app, "dist", "cli-bundle"), { recursive: true });
    await rm(join(app, "dist", "backends"), { recursive: true });
    // The first create and exec of this server: backend, engine and agent modules load now.
    const w = await server.ok("workspace_create", { backend: "bwrap" });
    const r = await server.ok("workspace_exec", { workspace_id: w.workspace_id, command: "echo still" });
    expect(r.stdout).toBe("still\n");
    expect(await server.ok("workspace_delete", { workspace_id: w.workspace_id })).toMatchObject({
      deleted: true,
    });
  });
});
