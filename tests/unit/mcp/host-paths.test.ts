import { existsSync, lstatSync, readdirSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { NO_SEED } from "../../../src/mcp/seed.js";
import { type McpFixture, mcpFixture, PROJECT } from "./helpers.js";

/**
 * Issue 10, item 6: over MCP, host paths (seed_path, source_path, output_path) come from
 * a model and must stay inside the project (the server's base directory and default
 * seed) or a directory allowed with --allow-host-path. Every refusal must change nothing:
 * a canary directory outside the project is compared, file by file, after each call.
 */

const CANARY = "host canary: must never be read into a workspace or changed\n";
const VICTIM = "victim: must never be overwritten\n";

/** Every entry below `dir`, with its type, mode, size, mtime and content: what "unchanged" means. */
function fingerprint(dir: string): string {
  const out: string[] = [];
  const walk = (d: string) => {
    for (const name of readdirSync(d).sort()) {
      const p = join(d, name);
      const st = lstatSync(p);
      const content = st.isFile() ? readFileSync(p, "utf8") : "";
      out.push(`${relative(dir, p)} ${st.mode} ${st.size} ${st.mtimeMs} ${JSON.stringify(content)}`);
      if (st.isDirectory()) walk(p);
    }
  };
  walk(dir);
  return out.join("\n");
}

describe("MCP host paths are confined to the project", () => {
  let fx: McpFixture;
  let outside: string;
  let before: string;
  let id: string;

  /** The refused call's error, after checking that the canary directory and the workspace did not change. */
  const refused = async (tool: string, args: Record<string, unknown>, code = "path_outside_workspace") => {
    const workspaces = (await fx.pyro.listWorkspaces()).count;
    const error = await fx.fails(tool, args);
    expect(error.code, `${tool} ${JSON.stringify(args)}: ${error.message}`).toBe(code);
    expect(fingerprint(outside), `${tool} changed the host outside the project`).toBe(before);
    expect((await fx.pyro.diffWorkspace(id)).changed, `${tool} changed the workspace`).toBe(false);
    expect((await fx.pyro.listWorkspaces()).count, `${tool} created a workspace`).toBe(workspaces);
    return error;
  };

  beforeAll(async () => {
    fx = await mcpFixture();
    outside = await mkdtemp(join(tmpdir(), "pyro-mcp-outside-"));
    await writeFile(join(outside, "host-marker"), CANARY);
    await writeFile(join(outside, "victim.txt"), VICTIM);
    await mkdir(join(outside, "dir"));
    await writeFile(join(outside, "dir", "secret.txt"), CANARY);
    // Inside the project, pointing out: a directory, a file, a parent, and a dangling link.
    await symlink(outside, join(fx.project, "link-out"));
    await symlink(join(outside, "host-marker"), join(fx.project, "marker-link"));
    await symlink(join(outside, "victim.txt"), join(fx.project, "victim-link"));
    await symlink(join(outside, "not-yet"), join(fx.project, "dangling"));
    await symlink("../../../../../../../../../..", join(fx.project, "to-root"));
    before = fingerprint(outside);
    id = (await fx.pyro.createWorkspace({ seedPath: fx.project })).workspace_id;
  });
  afterAll(async () => {
    await fx.cleanup();
    await rm(outside, { recursive: true, force: true });
  });

  const up = () => relative(fx.base, outside);

  it("refuses a sync_push source_path that climbs out with '..' (host-marker stays out of the workspace)", async () => {
    const error = await refused("workspace_sync_push", {
      workspace_id: id,
      source_path: `${up()}/host-marker`,
    });
    expect(error.message).toContain("outside the directories this MCP server may use");
    await refused("workspace_sync_push", { workspace_id: id, source_path: "../../../host-marker" });
    await refused("workspace_sync_push", { workspace_id: id, source_path: "project/../../.." });
    expect((await fx.pyro.listWorkspaceFiles(id, "/workspace")).entries.map((e) => e.path)).not.toContain(
      "host-marker",
    );
  });

  it("refuses an export output_path that climbs out with '..' and leaves the victim file as it was", async () => {
    await refused("workspace_export", {
      workspace_id: id,
      path: "calc.sh",
      output_path: `${up()}/victim.txt`,
      overwrite: true,
    });
    await refused("workspace_export", {
      workspace_id: id,
      path: "calc.sh",
      output_path: `project/../../${relative(join(fx.base, ".."), outside)}/new.txt`,
    });
    expect(await readFile(join(outside, "victim.txt"), "utf8")).toBe(VICTIM);
  });

  it("refuses a seed_path that climbs out with '..' (no workspace is created)", async () => {
    await refused("workspace_create", { seed_path: up() });
    await refused("workspace_create", { seed_path: "project/../.." });
  });

  it("refuses absolute host paths elsewhere on every host-path argument", async () => {
    await refused("workspace_create", { seed_path: outside });
    await refused("workspace_create", { seed_path: "/etc" });
    await refused("workspace_sync_push", { workspace_id: id, source_path: join(outside, "host-marker") });
    await refused("workspace_sync_push", { workspace_id: id, source_path: "/etc/passwd" });
    await refused("workspace_export", {
      workspace_id: id,
      path: "calc.sh",
      output_path: join(outside, "victim.txt"),
      overwrite: true,
    });
    await refused("workspace_export", {
      workspace_id: id,
      path: "calc.sh",
      output_path: join(outside, "new.txt"),
    });
  });

  it("refuses a symlink inside the project that points out, for reads and writes", async () => {
    await refused("workspace_sync_push", { workspace_id: id, source_path: "project/marker-link" });
    await refused("workspace_sync_push", { workspace_id: id, source_path: "project/link-out" });
    await refused("workspace_create", { seed_path: "project/link-out/dir" });
    await refused("workspace_create", { seed_path: "project/to-root" });
    const error = await refused("workspace_export", {
      workspace_id: id,
      path: "calc.sh",
      output_path: "project/victim-link",
      overwrite: true,
    });
    expect(error.message).toContain("symlink");
  });

  it("refuses a path under a symlinked parent directory that leads out, existing or not", async () => {
    await refused("workspace_sync_push", {
      workspace_id: id,
      source_path: "project/link-out/dir/secret.txt",
    });
    await refused("workspace_export", {
      workspace_id: id,
      path: "calc.sh",
      output_path: "project/link-out/new/deeper/file.txt",
    });
    await refused("workspace_export", {
      workspace_id: id,
      path: "docs",
      output_path: "project/link-out/docs",
    });
    await refused("workspace_export", {
      workspace_id: id,
      path: "calc.sh",
      output_path: `project/to-root${outside}/new.txt`,
    });
  });

  it("refuses a dangling symlink (it could be created outside later)", async () => {
    const error = await refused("workspace_export", {
      workspace_id: id,
      path: "calc.sh",
      output_path: "project/dangling",
    });
    expect(error.message).toContain("leads nowhere");
    await refused("workspace_export", { workspace_id: id, path: "docs", output_path: "project/dangling/x" });
  });

  it("refuses a NUL byte in a host path", async () => {
    await refused(
      "workspace_export",
      { workspace_id: id, path: "calc.sh", output_path: "out\0.txt" },
      "invalid_argument",
    );
    await refused(
      "workspace_sync_push",
      { workspace_id: id, source_path: "project\0/../.." },
      "invalid_argument",
    );
    await refused("workspace_create", { seed_path: "project\0" }, "invalid_argument");
  });

  it("refuses writes into a .git directory of the project", async () => {
    await mkdir(join(fx.project, ".git", "hooks"), { recursive: true });
    await refused("workspace_export", {
      workspace_id: id,
      path: "calc.sh",
      output_path: "project/.git/hooks/pre-commit",
    });
    await refused("workspace_export", { workspace_id: id, path: "docs", output_path: "project/.GIT/x" });
    expect(readdirSync(join(fx.project, ".git", "hooks"))).toEqual([]);
    await rm(join(fx.project, ".git"), { recursive: true });
  });

  it("names the allowed directories in the hint of every refusal", async () => {
    const error = await refused("workspace_sync_push", { workspace_id: id, source_path: outside });
    expect(error.hint).toContain(fx.base);
    expect(error.hint).toContain("--allow-host-path");
    expect(error.message).toContain(outside);
  });

  it("still allows paths inside the project, through symlinks that stay inside", async () => {
    await symlink("docs", join(fx.project, "docs-link"));
    const pushed = await fx.ok("workspace_sync_push", {
      workspace_id: id,
      source_path: "project/docs-link/readme.txt",
      dest: "/workspace/pushed",
    });
    expect(pushed).toMatchObject({ source: join(fx.project, "docs", "readme.txt"), files: 1 });
    const out = await fx.ok("workspace_export", {
      workspace_id: id,
      path: "calc.sh",
      output_path: "project/docs-link/calc-copy.sh",
    });
    expect(out.output_path).toBe(join(fx.project, "docs", "calc-copy.sh"));
    expect(await readFile(join(fx.project, "docs", "calc-copy.sh"), "utf8")).toBe(PROJECT["calc.sh"]);
    await fx.pyro.resetWorkspace(id);
    expect(fingerprint(outside)).toBe(before);
  });
});

describe("MCP workspace_export never overwrites without overwrite: true", () => {
  let fx: McpFixture;
  let id: string;
  beforeEach(async () => {
    fx = await mcpFixture();
    id = (await fx.pyro.createWorkspace({ seedPath: fx.project })).workspace_id;
  });
  afterEach(async () => {
    await fx.cleanup();
  });

  it("refuses to replace an existing file with conflict, and leaves it as it was", async () => {
    const target = join(fx.base, "keep.txt");
    await writeFile(target, VICTIM);
    const error = await fx.fails("workspace_export", {
      workspace_id: id,
      path: "calc.sh",
      output_path: "keep.txt",
    });
    expect(error).toMatchObject({ code: "conflict", hint: expect.stringContaining("overwrite: true") });
    expect(await readFile(target, "utf8")).toBe(VICTIM);
    const explicit = await fx.fails("workspace_export", {
      workspace_id: id,
      path: "calc.sh",
      output_path: "keep.txt",
      overwrite: false,
    });
    expect(explicit.code).toBe("conflict");
    expect(await readFile(target, "utf8")).toBe(VICTIM);
  });

  it("replaces an existing file when the call passes overwrite: true", async () => {
    const target = join(fx.base, "keep.txt");
    await writeFile(target, VICTIM);
    const r = await fx.ok("workspace_export", {
      workspace_id: id,
      path: "calc.sh",
      output_path: "keep.txt",
      overwrite: true,
    });
    expect(r).toMatchObject({ output_path: target, artifact_type: "file" });
    expect(await readFile(target, "utf8")).toBe(PROJECT["calc.sh"]);
  });

  it("refuses a non-empty directory even with overwrite: true, and accepts an empty one", async () => {
    await mkdir(join(fx.base, "full"));
    await writeFile(join(fx.base, "full", "a.txt"), VICTIM);
    for (const overwrite of [false, true]) {
      const error = await fx.fails("workspace_export", {
        workspace_id: id,
        path: "docs",
        output_path: "full",
        overwrite,
      });
      expect(error.code).toBe("conflict");
    }
    expect(readdirSync(join(fx.base, "full"))).toEqual(["a.txt"]);
    expect(await readFile(join(fx.base, "full", "a.txt"), "utf8")).toBe(VICTIM);
    await mkdir(join(fx.base, "empty"));
    const r = await fx.ok("workspace_export", { workspace_id: id, path: "docs", output_path: "empty" });
    expect(r).toMatchObject({ artifact_type: "directory" });
    expect(readdirSync(join(fx.base, "empty"))).toEqual(["readme.txt"]);
  });

  it("advertises overwrite as an optional boolean of workspace_export", async () => {
    const { tools } = await fx.client.listTools();
    const schema = tools.find((t) => t.name === "workspace_export")!.inputSchema;
    expect(schema.properties).toHaveProperty("overwrite", expect.objectContaining({ type: "boolean" }));
    expect(schema.required).not.toContain("overwrite");
    expect(Object.keys(schema.properties ?? {}).sort()).toEqual([
      "output_path",
      "overwrite",
      "path",
      "workspace_id",
    ]);
  });
});

describe("MCP --allow-host-path directories", () => {
  let fx: McpFixture;
  let allowed: string;
  let other: string;
  beforeAll(async () => {
    allowed = await mkdtemp(join(tmpdir(), "pyro-mcp-allowed-"));
    other = await mkdtemp(join(tmpdir(), "pyro-mcp-other-"));
    await mkdir(join(allowed, "data"));
    await writeFile(join(allowed, "data", "in.txt"), "from the allowed dir\n");
    await writeFile(join(other, "host-marker"), CANARY);
    await symlink(other, join(allowed, "link-out"));
    fx = await mcpFixture({ allowHostPaths: [allowed] });
    await symlink(join(allowed, "data"), join(fx.project, "data-link"));
  });
  afterAll(async () => {
    await fx.cleanup();
    await rm(allowed, { recursive: true, force: true });
    await rm(other, { recursive: true, force: true });
  });

  it("reads, seeds from and exports to an allowed directory outside the project", async () => {
    const w = await fx.ok("workspace_create", { seed_path: join(allowed, "data") });
    expect(w.workspace_seed).toMatchObject({
      kind: "directory",
      source: join(allowed, "data"),
      file_count: 1,
    });
    const pushed = await fx.ok("workspace_sync_push", {
      workspace_id: w.workspace_id,
      source_path: join(allowed, "data", "in.txt"),
      dest: "/workspace/pushed",
    });
    expect(pushed.files).toBe(1);
    const out = await fx.ok("workspace_export", {
      workspace_id: w.workspace_id,
      path: "pushed/in.txt",
      output_path: join(allowed, "out", "in.txt"),
    });
    expect(out.output_path).toBe(join(allowed, "out", "in.txt"));
    expect(await readFile(join(allowed, "out", "in.txt"), "utf8")).toBe("from the allowed dir\n");
  });

  it("follows a project symlink into an allowed directory", async () => {
    const w = await fx.ok("workspace_create", { seed_path: "project/data-link" });
    expect(w.workspace_seed).toMatchObject({ source: join(allowed, "data") });
  });

  it("still refuses other directories, and symlinks out of the allowed one", async () => {
    const before = fingerprint(other);
    const w = await fx.pyro.createWorkspace({});
    for (const source_path of [join(other, "host-marker"), join(allowed, "link-out", "host-marker")]) {
      const error = await fx.fails("workspace_sync_push", { workspace_id: w.workspace_id, source_path });
      expect(error.code).toBe("path_outside_workspace");
      expect(error.hint).toContain(allowed);
    }
    const error = await fx.fails("workspace_export", {
      workspace_id: w.workspace_id,
      path: "/workspace",
      output_path: join(allowed, "link-out", "x"),
    });
    expect(error.code).toBe("path_outside_workspace");
    expect(fingerprint(other)).toBe(before);
  });
});

describe("MCP host-path roots", () => {
  let fx: McpFixture | undefined;
  afterEach(async () => {
    await fx?.cleanup();
    fx = undefined;
  });

  it("never takes the filesystem root as the project (hosts that start servers in /)", async () => {
    fx = await mcpFixture({ baseDir: "/", seed: NO_SEED });
    const w = await fx.pyro.createWorkspace({});
    const target = join(fx.base, "root-escape");
    for (const [tool, args] of [
      ["workspace_create", { seed_path: "etc" }],
      ["workspace_sync_push", { workspace_id: w.workspace_id, source_path: "/etc/hostname" }],
      [
        "workspace_export",
        { workspace_id: w.workspace_id, path: "/workspace", output_path: target.slice(1) },
      ],
    ] as const) {
      const error = await fx.fails(tool, args);
      expect(error.code, tool).toBe("path_outside_workspace");
      expect(error.hint).toContain("allows no host paths");
    }
    expect(existsSync(target)).toBe(false);
  });

  it("also allows the default seed's directory (the checkout above a subdirectory the server started in)", async () => {
    // A base that does not exist allows nothing; the default seed (the fixture's project) is allowed.
    fx = await mcpFixture({ baseDir: join(tmpdir(), "pyro-no-such-base") });
    const r = await fx.ok("workspace_create", { seed_path: join(fx.project, "docs") });
    expect(r.workspace_seed).toMatchObject({ source: join(fx.project, "docs") });
    const error = await fx.fails("workspace_create", { seed_path: fx.base });
    expect(error.code).toBe("path_outside_workspace");
  });
});
