import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { type McpFixture, mcpFixture } from "./helpers.js";

let fx: McpFixture;
beforeEach(async () => {
  fx = await mcpFixture({ profile: "workspace-full" });
});
afterEach(() => fx.cleanup());

describe("disk_mib over MCP", () => {
  it("workspace_create takes a disk limit and the workspace reports it", async () => {
    const w = (await fx.ok("workspace_create", { disk_mib: 256 })) as { workspace_id: string };
    const s = (await fx.ok("workspace_status", { workspace_id: w.workspace_id })) as {
      limits: { disk_mib: number | null };
    };
    expect(s.limits.disk_mib).toBe(256);
  });

  it("refuses a disk limit below 64 MiB or not whole, creating nothing", async () => {
    for (const disk_mib of [10, 100.5]) {
      expect((await fx.fails("workspace_create", { disk_mib })).code).toBe("invalid_argument");
    }
    expect(((await fx.ok("workspace_list", {})) as { count: number }).count).toBe(0);
  });
});
