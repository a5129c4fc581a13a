import { spawn, spawnSync } from "node:child_process";
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PYRO_BIN, REPO_ROOT } from "../../helpers/cli.js";
import { runProcess } from "./helpers.js";
import { stdioBridge } from "./stdio-bridge.js";

/**
 * The official MCP conformance runner (@modelcontextprotocol/conformance, pinned in
 * scripts/install-conformance, run on the Node 22 it needs) against `pyro mcp serve`
 * over Streamable HTTP and over stdio. The runner speaks HTTP only: for stdio, a bridge
 * (stdio-bridge.ts) launches `pyro mcp serve` per session and relays messages as they
 * come. docs/mcp.md lists the scenarios that do not apply and why.
 */

/** Scenarios that test the protocol itself: they must pass. */
const APPLICABLE = [
  "server-initialize",
  "ping",
  "logging-set-level",
  "tools-list",
  "resources-list",
  "prompts-list",
] as const;
/** Streamable HTTP only: pyro's HTTP transport (the bridge would be tested instead on stdio). */
const HTTP_ONLY = ["server-sse-multiple-streams", "dns-rebinding-protection"] as const;

/** Scenarios that drive the runner's reference server's fixtures, which pyro has no reason to have. */
export const NOT_APPLICABLE: Record<string, string> = {
  "completion-complete": "completes an argument of the reference prompt test_prompt_with_arguments",
  "tools-call-simple-text": "calls the reference tool test_simple_text",
  "tools-call-image": "calls the reference tool test_image_content",
  "tools-call-audio": "calls the reference tool test_audio_content",
  "tools-call-embedded-resource": "calls the reference tool test_embedded_resource",
  "tools-call-mixed-content": "calls the reference tool test_multiple_content_types",
  "tools-call-with-logging": "calls the reference tool test_tool_with_logging",
  "tools-call-error": "calls the reference tool test_error_handling",
  "tools-call-with-progress": "calls the reference tool test_tool_with_progress",
  "tools-call-sampling": "calls the reference tool test_sampling (pyro never asks the client to sample)",
  "tools-call-elicitation": "calls the reference tool test_elicitation (pyro never elicits)",
  "elicitation-sep1034-defaults": "calls the reference tool test_elicitation_sep1034_defaults",
  "elicitation-sep1330-enums": "calls the reference tool test_elicitation_sep1330_enums",
  "json-schema-2020-12": "looks for the reference tool json_schema_2020_12_tool",
  "server-sse-polling": "calls the reference tool test_reconnection, which closes its stream mid-call",
  "resources-read-text": "reads the reference resource test://static-text",
  "resources-read-binary": "reads the reference resource test://static-binary",
  "resources-templates-read": "reads the reference template test://template/{id}/data",
  "resources-subscribe": "subscribes to the reference resource test://watched-resource",
  "resources-unsubscribe": "unsubscribes from the reference resource test://watched-resource",
  "prompts-get-simple": "gets the reference prompt test_simple_prompt",
  "prompts-get-with-args": "gets the reference prompt test_prompt_with_arguments",
  "prompts-get-embedded-resource": "gets the reference prompt test_prompt_with_embedded_resource",
  "prompts-get-with-image": "gets the reference prompt test_prompt_with_image",
};

function install(): { node: string; runner: string } | string {
  const r = spawnSync("bash", [join(REPO_ROOT, "scripts", "install-conformance")], {
    encoding: "utf8",
    timeout: 300_000,
  });
  if (r.status !== 0)
    return `the conformance runner could not be installed from the npm registry: ${(r.stderr || r.error?.message || "").trim().slice(0, 300)}`;
  const [node, runner] = r.stdout.trim().split(" ");
  return node && runner ? { node, runner } : `scripts/install-conformance printed '${r.stdout.trim()}'`;
}
const installed = install();
const skip = typeof installed === "string" ? installed : "";

interface Outcome {
  scenario: string;
  passed: number;
  failed: number;
  failures: string[];
}

/** Reads the runner's results directory: one subdirectory per scenario with its checks. */
async function outcomes(dir: string): Promise<Map<string, Outcome>> {
  const out = new Map<string, Outcome>();
  for (const d of await readdir(dir)) {
    const m = /^server-(.+)-\d{4}-\d\d-\d\dT/.exec(d);
    if (!m?.[1]) continue;
    const checks = JSON.parse(await readFile(join(dir, d, "checks.json"), "utf8")) as {
      status: string;
      name: string;
      errorMessage?: string;
    }[];
    const failures = checks.filter((c) => c.status === "FAILURE");
    out.set(m[1], {
      scenario: m[1],
      passed: checks.filter((c) => c.status === "SUCCESS").length,
      failed: failures.length,
      failures: failures.map((c) => `${c.name}: ${c.errorMessage ?? ""}`),
    });
  }
  return out;
}

describe.skipIf(skip !== "")(
  `the MCP conformance runner against pyro mcp serve${skip ? ` (skipped: ${skip})` : ""}`,
  () => {
    const tools = installed as { node: string; runner: string };
    let root: string;
    let env: Record<string, string>;
    const serveArgs = ["mcp", "serve", "--profile", "workspace-full"];

    beforeAll(async () => {
      root = await mkdtemp(join(tmpdir(), "pyro-it-conformance-"));
      env = Object.fromEntries(
        Object.entries({ ...process.env, PYRO_HOME: join(root, "home"), PYRO_DEBUG: "" }).filter(
          (e): e is [string, string] => e[1] !== undefined,
        ),
      );
    });
    afterAll(async () => {
      await rm(root, { recursive: true, force: true });
    });

    /** Runs the runner (one scenario, or the active suite) and reads what it found. */
    const run = async (url: string, label: string, scenario?: string) => {
      const outDir = join(root, `${label}-${scenario ?? "suite"}`);
      const r = await runProcess(
        [
          tools.node,
          tools.runner,
          "server",
          "--url",
          url,
          ...(scenario ? ["--scenario", scenario] : []),
          "-o",
          outDir,
        ],
        { cwd: root, env, timeoutMs: 300_000 },
      );
      const found = await outcomes(outDir).catch(() => new Map<string, Outcome>());
      if (found.size === 0) throw new Error(`the runner produced no results: ${r.stdout}\n${r.stderr}`);
      return found;
    };

    const report = (label: string, found: Map<string, Outcome>) => {
      const all = [...found.values()];
      const ok = all.filter((o) => o.failed === 0);
      const applicable = all.filter((o) => !(o.scenario in NOT_APPLICABLE));
      console.log(
        `conformance over ${label}: ${ok.length} passed, ${all.length - ok.length} failed of ${all.length} scenarios; applicable: ${applicable.filter((o) => o.failed === 0).length} passed, ${applicable.filter((o) => o.failed > 0).length} failed of ${applicable.length}`,
      );
    };

    it("passes every applicable scenario of the active suite over Streamable HTTP", async () => {
      const child = spawn(process.execPath, [PYRO_BIN, ...serveArgs, "--http", "127.0.0.1:0"], {
        cwd: root,
        env,
        stdio: ["ignore", "ignore", "pipe"],
      });
      try {
        const url = await new Promise<string>((resolve, reject) => {
          let err = "";
          child.stderr.on("data", (c: Buffer) => {
            err += c.toString("utf8");
            const m = /at (http:\/\/127\.0\.0\.1:\d+\/mcp)/.exec(err);
            if (m?.[1]) resolve(m[1]);
          });
          child.once("exit", (code) => reject(new Error(`pyro mcp serve exited ${code}: ${err}`)));
        });
        const found = await run(url, "http");
        report("Streamable HTTP", found);
        for (const s of [...APPLICABLE, ...HTTP_ONLY])
          expect(found.get(s), `${s}: ${found.get(s)?.failures.join("; ") ?? "did not run"}`).toMatchObject({
            failed: 0,
          });
        // A scenario the runner gained since is either applicable or listed with its reason.
        const known = new Set<string>([...APPLICABLE, ...HTTP_ONLY, ...Object.keys(NOT_APPLICABLE)]);
        expect([...found.keys()].filter((s) => !known.has(s))).toEqual([]);
      } finally {
        child.kill("SIGTERM");
      }
    });

    it("passes the protocol scenarios over stdio (through a relay to the runner's HTTP client)", async () => {
      const bridge = await stdioBridge({
        command: process.execPath,
        args: [PYRO_BIN, ...serveArgs],
        cwd: root,
        env,
      });
      try {
        const found = new Map<string, Outcome>();
        for (const s of APPLICABLE) for (const [k, v] of await run(bridge.url, "stdio", s)) found.set(k, v);
        report("stdio", found);
        for (const s of APPLICABLE)
          expect(
            found.get(s),
            `${s}: ${found.get(s)?.failures.join("; ") ?? "did not run"}\n${bridge.stderr()}`,
          ).toMatchObject({
            failed: 0,
          });
      } finally {
        await bridge.close();
      }
    });
  },
);
