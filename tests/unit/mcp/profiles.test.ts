import { describe, expect, it } from "vitest";
import { PyroError } from "../../../src/errors.js";
import {
  MODE_NAMES,
  MODES,
  PROFILE_NAMES,
  PROFILES,
  TOOL_NAMES,
  toolNames,
  toolSet,
} from "../../../src/mcp/profiles.js";
import { PINNED } from "./pinned.js";

describe("profiles and modes", () => {
  it("are exactly the pinned profiles and modes", () => {
    expect(PROFILE_NAMES).toEqual(["vm-run", "workspace-core", "workspace-full"]);
    expect(MODE_NAMES).toEqual(["repro-fix", "inspect", "cold-start", "review-eval"]);
  });

  for (const name of PROFILE_NAMES) {
    it(`profile ${name} has exactly its pinned tools`, () => {
      expect(toolNames({ profile: name })).toEqual(PINNED[name]);
      expect(PROFILES[name].kind).toBe("profile");
    });
  }
  for (const name of MODE_NAMES) {
    it(`mode ${name} has exactly its pinned tools`, () => {
      expect(toolNames({ mode: name })).toEqual(PINNED[name]);
      expect(MODES[name].kind).toBe("mode");
    });
  }

  it("workspace-core is the contract's 17 tools and the default", () => {
    expect(toolNames()).toEqual(PINNED["workspace-core"]);
    expect(toolNames()).toHaveLength(17);
  });

  it("workspace-full is workspace-core plus snapshots, stop/start, network blocks, services, disk tools and shells, and is every tool there is", () => {
    const full = toolNames({ profile: "workspace-full" });
    expect(full.slice(0, 17)).toEqual(PINNED["workspace-core"]);
    expect(full).toHaveLength(38);
    expect(full.slice(28, 31)).toEqual([
      "workspace_disk_list",
      "workspace_disk_read",
      "workspace_disk_export",
    ]);
    expect(full.slice(31, 36)).toEqual([
      "shell_open",
      "shell_read",
      "shell_write",
      "shell_signal",
      "shell_close",
    ]);
    expect(full.slice(36)).toEqual(["workspace_commit", "environment_build"]);
    expect([...full].sort()).toEqual([...TOOL_NAMES].sort());
  });

  it("modes are curated subsets of workspace-full, each with create, exec, summary and delete", () => {
    for (const mode of MODE_NAMES) {
      const tools = toolNames({ mode });
      for (const t of tools) expect(TOOL_NAMES).toContain(t);
      expect(new Set(tools).size).toBe(tools.length);
      for (const t of ["workspace_create", "workspace_exec", "workspace_summary", "workspace_delete"])
        expect(tools).toContain(t);
    }
    // review-eval is shell-driven; cold-start keeps services alive until ready.
    for (const t of ["shell_open", "shell_read", "shell_write", "shell_signal", "shell_close"])
      expect(toolNames({ mode: "review-eval" })).toContain(t);
    for (const t of ["service_start", "service_status", "service_logs"])
      expect(toolNames({ mode: "cold-start" })).toContain(t);
    // inspect keeps the smallest persistent surface: nothing that edits files.
    for (const t of ["workspace_file_write", "workspace_patch_apply", "workspace_sync_push"]) {
      expect(toolNames({ mode: "inspect" })).not.toContain(t);
    }
  });

  it("only workspace-full offers network options on create", () => {
    expect(toolSet({ profile: "workspace-full" }).fullCreate).toBe(true);
    for (const p of ["vm-run", "workspace-core"]) expect(toolSet({ profile: p }).fullCreate).toBe(false);
    // cold-start installs dependencies and serves on a published port: it has them too.
    for (const m of MODE_NAMES) expect(toolSet({ mode: m }).fullCreate, m).toBe(m === "cold-start");
  });

  it("refuses unknown names and a profile together with a mode", () => {
    for (const bad of [{ profile: "nope" }, { mode: "nope" }, { profile: "vm-run", mode: "inspect" }]) {
      let err: unknown;
      try {
        toolSet(bad);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(PyroError);
      expect((err as PyroError).code).toBe("invalid_argument");
    }
  });
});
