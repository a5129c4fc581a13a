import type { Duplex } from "node:stream";
import { afterEach, beforeEach, expect, it } from "vitest";
import type { SandboxState, WorkspaceBackend } from "../../../src/backends/backend.js";
import { AgentConnections } from "../../../src/core/connections.js";
import { sandboxState } from "../../../src/core/workspace-deps.js";
import { fakePyro } from "../../helpers/engine.js";

let t: Awaited<ReturnType<typeof fakePyro>>;
beforeEach(async () => {
  t = await fakePyro();
});
afterEach(async () => {
  await t.cleanup();
});

it("a connection that fails after a drop leaves the newer one cached, live and closed by closeAll", async () => {
  const w = await t.pyro.createWorkspace({});
  const state = sandboxState(await t.pyro.engine.workspaces.get(w.workspace_id)) as SandboxState;
  let failFirst: (err: Error) => void = () => {};
  let calls = 0;
  const backend = {
    connect: (s: SandboxState, o?: { timeoutMs?: number }) =>
      calls++ === 0
        ? new Promise<Duplex>((_, reject) => {
            failFirst = reject;
          })
        : t.backend.connect(s, o),
  } as unknown as WorkspaceBackend;
  const conns = new AgentConnections();
  conns.get(w.workspace_id, state, backend).catch(() => {});
  const dropping = conns.drop(w.workspace_id);
  const newer = await conns.get(w.workspace_id, state, backend);
  failFirst(new Error("the old sandbox is gone"));
  await dropping;
  expect(conns.live(w.workspace_id, state)).toBe(true);
  expect(await conns.get(w.workspace_id, state, backend)).toBe(newer);
  await conns.closeAll();
  expect(newer.closed).toBe(true);
});
