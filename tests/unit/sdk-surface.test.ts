import { describe, expect, it } from "vitest";
import { ERROR_CODES } from "../../src/errors.js";
import * as sdk from "../../src/sdk/index.js";

describe("public SDK surface", () => {
  it("exports exactly the documented names", () => {
    expect(Object.keys(sdk).sort()).toEqual([
      "BACKEND_NAMES",
      "DEFAULT_ENVIRONMENT",
      "ERROR_CODES",
      "OFFICIAL_ENVIRONMENTS",
      "Pyro",
      "PyroError",
    ]);
  });

  it("offers the camelCase workspace methods of the contract", () => {
    const methods = Object.getOwnPropertyNames(sdk.Pyro.prototype)
      .filter((m) => m !== "constructor")
      .sort();
    expect(methods).toEqual(
      [
        "applyWorkspacePatch",
        "close",
        "createSnapshot",
        "createWorkspace",
        "deleteSnapshot",
        "deleteWorkspace",
        "demo",
        "diffWorkspace",
        "doctor",
        "execWorkspace",
        "exportWorkspace",
        "getWorkspace",
        "inspectEnvironment",
        "listEnvironments",
        "listSnapshots",
        "listWorkspaceFiles",
        "listWorkspaces",
        "prepare",
        "pruneEnvironments",
        "pullEnvironment",
        "readWorkspaceFile",
        "resetWorkspace",
        "run",
        "startWorkspace",
        "stopWorkspace",
        "summarizeWorkspace",
        "syncPushWorkspace",
        "updateWorkspace",
        "workspaceLogs",
        "workspaceStatus",
        "writeWorkspaceFile",
      ].sort(),
    );
  });

  it("pins the error codes callers branch on", () => {
    expect(ERROR_CODES).toEqual(
      expect.arrayContaining([
        "workspace_not_found",
        "environment_not_found",
        "backend_unavailable",
        "path_outside_workspace",
        "not_found",
        "patch_rejected",
        "invalid_argument",
        "timeout",
        "conflict",
        "workspace_stopped",
      ]),
    );
  });

  it("keeps no module-level state: two clients with different homes are independent", () => {
    const a = new sdk.Pyro({ home: "/tmp/pyro-a", env: {} });
    const b = new sdk.Pyro({ home: "/tmp/pyro-b", env: {} });
    expect(a.engine.paths.home).not.toBe(b.engine.paths.home);
    expect(a.engine.workspaces).not.toBe(b.engine.workspaces);
  });
});
