import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bwrapSkipReason, type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";
import {
  launchStdio,
  median,
  PYTHON_FIX,
  PYTHON_PROJECT,
  pythonCheckout,
  RUN_TESTS,
  type StdioServer,
} from "./helpers.js";

/**
 * The product entrypoint as a host runs it: `pyro mcp serve` launched over stdio from
 * inside a Git checkout, driving the repro-plus-fix loop on the real bwrap backend.
 */
const skip = bwrapSkipReason();

describe.skipIf(skip !== "")(
  suiteTitle("pyro mcp serve over stdio from a Git checkout, on bwrap", skip),
  () => {
    let h: Harness;
    let checkout: string;
    let commit: string;
    let out: string;
    let server: StdioServer;

    beforeAll(async () => {
      h = await openHarness("mcp-stdio");
      checkout = await h.tempDir("checkout");
      out = await h.tempDir("out");
      ({ commit } = await pythonCheckout(checkout));
      // `out` is outside the checkout: MCP may write there only because the user allowed it.
      server = await launchStdio({ cwd: checkout, env: h.cliEnv, args: ["--allow-host-path", out] });
    });
    afterAll(async () => {
      await server?.close();
      await h?.cleanup();
    });

    it("runs the repro-plus-fix loop: create without seed_path, fail, patch, pass, diff, export, reset, delete", async () => {
      const w = await server.ok("workspace_create", {
        name: "repro",
        backend: "bwrap",
        labels: { task: "calc" },
      });
      expect(w).toMatchObject({
        name: "repro",
        backend: "bwrap",
        execution_mode: "guest_agent",
        state: "running",
      });
      // The checkout the server started in is the seed: its tracked files at HEAD's commit,
      // the untracked scratch.txt (not ignored) and the repository itself as .git.
      expect(w.workspace_seed).toMatchObject({
        kind: "git",
        source: checkout,
        commit,
        file_count: Object.keys(PYTHON_PROJECT).length + 1,
      });
      expect(w.default_seed).toEqual({ origin: "cwd", path: checkout });
      const files = await server.ok("workspace_file_list", { workspace_id: "repro" });
      expect(files.entries.map((e: { path: string }) => e.path).sort()).toEqual([
        ".git",
        "README.md",
        "calc.py",
        "scratch.txt",
        "test_calc.py",
      ]);

      const failing = await server.ok("workspace_exec", { workspace_id: "repro", command: RUN_TESTS });
      expect(failing.exit_code).not.toBe(0);
      expect(failing.stderr).toContain("add(2, 3) should be 5");

      const patched = await server.ok("workspace_patch_apply", { workspace_id: "repro", patch: PYTHON_FIX });
      expect(patched).toMatchObject({ changed: true, files: [{ path: "calc.py", status: "modified" }] });

      const passing = await server.ok("workspace_exec", { workspace_id: "repro", command: RUN_TESTS });
      expect(passing).toMatchObject({ exit_code: 0, stdout: "tests passed\n" });

      const diff = await server.ok("workspace_diff", { workspace_id: "repro" });
      expect(diff).toMatchObject({
        changed: true,
        summary: { total: 1, modified: 1 },
        entries: [{ path: "calc.py", status: "modified" }],
      });
      expect(diff.patch).toContain("+    return a + b");

      const exported = await server.ok("workspace_export", {
        workspace_id: "repro",
        path: "calc.py",
        output_path: join(out, "calc.py"),
      });
      expect(exported).toMatchObject({ artifact_type: "file", output_path: join(out, "calc.py") });
      expect(await readFile(join(out, "calc.py"), "utf8")).toBe("def add(a, b):\n    return a + b\n");
      // The checkout on the host is untouched.
      expect(await readFile(join(checkout, "calc.py"), "utf8")).toBe(PYTHON_PROJECT["calc.py"]);

      const summary = await server.ok("workspace_summary", { workspace_id: "repro" });
      expect(summary.outcome).toMatchObject({
        command_count: 2,
        export_count: 1,
        last_command: { exit_code: 0 },
      });

      const reset = await server.ok("workspace_reset", { workspace_id: "repro" });
      expect(reset).toMatchObject({ reset_count: 1, workspace_reset: { snapshot_name: "baseline" } });
      const again = await server.ok("workspace_exec", { workspace_id: "repro", command: RUN_TESTS });
      expect(again.exit_code).not.toBe(0);

      expect(await server.ok("workspace_delete", { workspace_id: "repro" })).toMatchObject({ deleted: true });
      expect((await server.ok("workspace_list")).count).toBe(0);
      const gone = await server.call("workspace_status", { workspace_id: "repro" });
      expect(gone).toMatchObject({
        isError: true,
        structuredContent: { error: { code: "workspace_not_found" } },
      });
    });

    it("adds little to a warm workspace_exec over the SDK (median of `true`, same run)", async () => {
      const w = await server.ok("workspace_create", { name: "bench", backend: "bwrap" });
      const rounds = 30;
      const viaMcp: number[] = [];
      const viaSdk: number[] = [];
      // Warm both paths: agent connections, first-use costs.
      for (let i = 0; i < 3; i++) {
        await server.ok("workspace_exec", { workspace_id: w.workspace_id, command: "true" });
        await h.pyro.execWorkspace(w.workspace_id, "true");
      }
      for (let i = 0; i < rounds; i++) {
        let t = performance.now();
        const m = await server.ok("workspace_exec", { workspace_id: w.workspace_id, command: "true" });
        viaMcp.push(performance.now() - t);
        expect(m.exit_code).toBe(0);
        t = performance.now();
        const s = await h.pyro.execWorkspace(w.workspace_id, "true");
        viaSdk.push(performance.now() - t);
        expect(s.exit_code).toBe(0);
      }
      const mcp = median(viaMcp);
      const sdk = median(viaSdk);
      console.log(
        `workspace_exec of \`true\` on bwrap, median of ${rounds}: MCP stdio ${mcp.toFixed(2)} ms, SDK ${sdk.toFixed(2)} ms, overhead ${(mcp - sdk).toFixed(2)} ms`,
      );
      // Generous bound: the MCP hop is JSON-RPC over a pipe plus schema checks, not a sandbox round trip.
      expect(mcp - sdk).toBeLessThan(50);
      await server.ok("workspace_delete", { workspace_id: w.workspace_id });
    });
  },
);
