import { describe, expect, it } from "vitest";

describe("state changes", () => {
  it("allows the lifecycle's transitions and refuses the rest as a bug", async () => {
    const { assertTransition } = await import("../../../src/core/lifecycle.js");
    for (const [from, to] of [
      ["creating", "running"],
      ["running", "error"],
      ["error", "running"],
      ["error", "stopped"],
      ["stopped", "running"],
      ["running", "deleting"],
      ["creating", "deleting"],
    ] as const)
      expect(() => assertTransition(from, to, "ws_x")).not.toThrow();
    for (const [from, to] of [
      ["deleting", "running"],
      ["creating", "stopped"],
      ["creating", "error"],
      ["deleting", "error"],
    ] as const)
      expect(() => assertTransition(from, to, "ws_x")).toThrow(/cannot go from/);
  });
});
