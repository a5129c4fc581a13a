import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MCP_OUTPUT_BYTES, MCP_RESULT_BYTES } from "../../../src/mcp/output.js";
import { type McpFixture, mcpFixture } from "./helpers.js";

/** `seq 1 200000`: 1,288,895 bytes, the example of an output that flooded a model's context. */
const SEQ = Array.from({ length: 200_000 }, (_, i) => `${i + 1}\n`).join("");
const MARKER = /\[\.\.\. (\d+) bytes omitted \.\.\.\]/;

/** Bytes of a tool result as it goes on the wire (the JSON-RPC result body). */
const wireBytes = (r: CallToolResult) => Buffer.byteLength(JSON.stringify(r));
const textOf = (r: CallToolResult) => (r.content[0] as { text: string }).text;

let fx: McpFixture;
let id: string;
beforeAll(async () => {
  fx = await mcpFixture({ profile: "workspace-full" });
  id = (await fx.ok("workspace_create", {})).workspace_id;
});
afterAll(() => fx.cleanup());

describe("command output over MCP", () => {
  it("keeps a huge workspace_exec result under the hosts' bound, with the tail and the full sizes", async () => {
    const r = await fx.call("workspace_exec", { workspace_id: id, command: "seq 1 200000" });
    expect(r.isError).toBeFalsy();
    expect(wireBytes(r)).toBeLessThan(MCP_RESULT_BYTES);
    const s = r.structuredContent as Record<string, any>;
    expect(s).toMatchObject({ exit_code: 0, truncated: true, stdout_bytes: SEQ.length, stderr_bytes: 0 });
    expect(s.stdout.startsWith("1\n2\n3\n")).toBe(true);
    expect(s.stdout.endsWith("199999\n200000\n")).toBe(true);
    const kept = Buffer.byteLength(s.stdout.replace(MARKER, ""));
    expect(Number(MARKER.exec(s.stdout)![1])).toBeGreaterThanOrEqual(SEQ.length - kept);
    expect(kept).toBeLessThanOrEqual(MCP_OUTPUT_BYTES + 2);
    // The text a model reads holds the tail too, once.
    expect(textOf(r)).toContain("199999\n200000");
    expect(textOf(r).split("200000\n").length - 1).toBeLessThanOrEqual(1);
    expect(textOf(r)).toContain(`stdout ${SEQ.length} bytes`);
  });

  it("reads the command's full kept output back through workspace_logs by seq", async () => {
    const exec = await fx.ok("workspace_exec", { workspace_id: id, command: "seq 1 200000; echo done >&2" });
    const logs = await fx.call("workspace_logs", { workspace_id: id, seq: exec.seq });
    expect(wireBytes(logs)).toBeLessThan(MCP_RESULT_BYTES);
    const [c] = (logs.structuredContent as any).commands;
    expect(c).toMatchObject({ seq: exec.seq, full_output: true, stdout_bytes: SEQ.length, stderr: "done\n" });
    expect(c.stdout.endsWith("200000\n")).toBe(true);

    // Asked for, the history gives 1 MiB of the stream: its first and last 512 KiB.
    const all = await fx.ok("workspace_logs", {
      workspace_id: id,
      seq: exec.seq,
      max_output_bytes: 1024 * 1024,
    });
    const out: string = all.commands[0].stdout;
    const m = MARKER.exec(out)!;
    expect(out.slice(0, m.index)).toBe(`${SEQ.slice(0, 512 * 1024)}\n`);
    expect(out.slice(m.index + m[0].length + 1)).toBe(SEQ.slice(-512 * 1024));
    expect(Number(m[1])).toBe(SEQ.length - 1024 * 1024);
  });

  it("keeps the listing of workspace_logs under the bound, each command with its full sizes", async () => {
    for (let i = 0; i < 3; i++) {
      await fx.ok("workspace_exec", { workspace_id: id, command: "head -c 20000 /dev/zero | tr '\\0' x" });
    }
    const logs = await fx.call("workspace_logs", { workspace_id: id });
    expect(wireBytes(logs)).toBeLessThan(MCP_RESULT_BYTES);
    const commands = (logs.structuredContent as any).commands;
    expect(commands.at(-1)).toMatchObject({ stdout_bytes: 20_000, stderr_bytes: 0 });
  });

  it("stays under the bound when every byte of output needs escaping in JSON", async () => {
    const r = await fx.call("workspace_exec", {
      workspace_id: id,
      command: "head -c 300000 /dev/zero; head -c 300000 /dev/zero >&2",
    });
    expect(wireBytes(r)).toBeLessThan(MCP_RESULT_BYTES);
    expect(r.structuredContent).toMatchObject({
      truncated: true,
      stdout_bytes: 300_000,
      stderr_bytes: 300_000,
    });
  });

  it("keeps vm_run under the bound with the tail of the output", async () => {
    const r = await fx.call("vm_run", { command: "seq 1 200000" });
    expect(r.isError).toBeFalsy();
    expect(wireBytes(r)).toBeLessThan(MCP_RESULT_BYTES);
    const s = r.structuredContent as Record<string, any>;
    expect(s).toMatchObject({ truncated: true, stdout_bytes: SEQ.length });
    expect(s.stdout.endsWith("200000\n")).toBe(true);
  });

  it("honours an explicit max_output_bytes and refuses one out of bounds", async () => {
    const r = await fx.ok("workspace_exec", {
      workspace_id: id,
      command: "seq 1 200000",
      max_output_bytes: 4096,
    });
    expect(Buffer.byteLength(r.stdout.replace(MARKER, ""))).toBeLessThanOrEqual(4096 + 2);
    expect(r.stdout.endsWith("200000\n")).toBe(true);
    const big = await fx.ok("workspace_exec", {
      workspace_id: id,
      command: "seq 1 20000",
      max_output_bytes: 200_000,
    });
    expect(big).toMatchObject({ truncated: false, stdout: SEQ.slice(0, big.stdout_bytes) });
    for (const bad of [100, 64 * 1024 * 1024, 1.5]) {
      const e = await fx.fails("workspace_exec", {
        workspace_id: id,
        command: "true",
        max_output_bytes: bad,
      });
      expect(e.code).toBe("invalid_argument");
    }
    expect((await fx.fails("workspace_logs", { workspace_id: id, seq: 100_000 })).code).toBe("not_found");
  });

  it("leaves a small output whole and untruncated", async () => {
    const r = await fx.ok("workspace_exec", { workspace_id: id, command: "echo hi; echo err >&2" });
    expect(r).toMatchObject({
      stdout: "hi\n",
      stderr: "err\n",
      stdout_bytes: 3,
      stderr_bytes: 4,
      truncated: false,
    });
  });
});
