import { existsSync } from "node:fs";
import { isAbsolute } from "node:path";
import { describe, expect, it } from "vitest";
import {
  launchCommand,
  normaliseServeOptions,
  parseLaunch,
  pyroBinPath,
  shellJoin,
} from "../../../src/hosts/launch.js";

describe("the launch command hosts get", () => {
  it("starts this node and this package's bin/pyro.js by absolute path", () => {
    const l = launchCommand();
    expect(l.server_name).toBe("pyro");
    expect(l.command).toBe(process.execPath);
    expect(isAbsolute(l.args[0] ?? "")).toBe(true);
    expect(l.args[0]).toBe(pyroBinPath());
    expect(existsSync(pyroBinPath())).toBe(true);
    expect(l.args.slice(1)).toEqual(["mcp", "serve"]);
  });

  it("carries serve options as flags, with project_path made absolute", () => {
    const l = launchCommand(
      normaliseServeOptions(
        { profile: "workspace-full", project_path: "sub", allow_host_compat: true },
        "/x",
      ),
    );
    expect(l.args.slice(1)).toEqual([
      "mcp",
      "serve",
      "--profile",
      "workspace-full",
      "--project-path",
      "/x/sub",
      "--allow-host-compat",
    ]);
  });

  it("refuses unknown names and combinations mcp serve would refuse", () => {
    expect(() => normaliseServeOptions({ profile: "nope" })).toThrow(/unknown profile/);
    expect(() => normaliseServeOptions({ mode: "nope" })).toThrow(/unknown mode/);
    expect(() => normaliseServeOptions({ mode: "inspect", profile: "vm-run" })).toThrow(/mutually exclusive/);
    expect(() => normaliseServeOptions({ repo_ref: "main" })).toThrow(/needs --repo-url/);
    expect(() => normaliseServeOptions({ repo_url: "u", project_path: "/p" })).toThrow(/mutually exclusive/);
  });

  it("reads an entry's argv back into serve options and launcher", () => {
    const l = launchCommand(
      { mode: "repro-fix", repo_url: "https://example.invalid/r.git", repo_ref: "v1" },
      { binPath: "/opt/pyro/bin/pyro.js" },
    );
    expect(parseLaunch(l.command, l.args)).toEqual({
      launcher: "/opt/pyro/bin/pyro.js",
      serves: true,
      options: { mode: "repro-fix", repo_url: "https://example.invalid/r.git", repo_ref: "v1" },
    });
    expect(parseLaunch("pyro", ["mcp", "serve"])).toEqual({ launcher: null, serves: true, options: {} });
    expect(parseLaunch("node", ["x.js", "doctor"]).serves).toBe(false);
  });

  it("quotes argv for copy-paste shell lines", () => {
    expect(shellJoin(["/usr/bin/node", "/a b/pyro.js", "it's"])).toBe(
      `/usr/bin/node '/a b/pyro.js' 'it'\\''s'`,
    );
  });
});
