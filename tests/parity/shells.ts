import { readFile } from "node:fs/promises";
import { expect } from "vitest";
import type { PyroError } from "../../src/errors.js";
import type { Pyro } from "../../src/sdk/index.js";
import { pyro as cliPyro } from "../helpers/cli.js";
import type { Scenario, ScenarioContext } from "./scenarios.js";

/**
 * The shell scenarios of the parity suite (issue 14): PTY shells through the SDK on every
 * backend; on real backends also through the CLI from another process (a shell lives in
 * the sandbox's agent, not in the process that opened it).
 */

const ESC = "\u001b";

async function code(p: Promise<unknown>): Promise<string> {
  return p.then(
    () => "ok",
    (e: PyroError) => e.code,
  );
}

/** Whether a host pid is a live (non-zombie) process. */
async function alive(pid: number): Promise<boolean> {
  const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => null);
  if (!stat) return false;
  const state = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0];
  return state !== "Z" && state !== "X";
}

async function withWorkspace(ctx: ScenarioContext, fn: (id: string) => Promise<void>) {
  const w = await ctx.pyro.createWorkspace({ ...ctx.createOptions, seedPath: ctx.seed });
  try {
    await fn(w.workspace_id);
  } finally {
    await ctx.pyro.deleteWorkspace(w.workspace_id).catch(() => {});
  }
}

/** Types a command and returns the plain batch it printed (read once the shell is quiet). */
async function run(pyro: Pyro, id: string, sh: string, input: string, idleMs = 500): Promise<string> {
  await pyro.writeShell(id, sh, input);
  return (await pyro.readShell(id, sh, { plain: true, waitForIdleMs: idleMs })).output;
}

export const SHELL_SCENARIOS: Scenario[] = [
  {
    name: "shells: run a command, plain rendering (colour, a \\r progress bar, a full screen), idle batching, cursors, resize, INT, close",
    run: (ctx) =>
      withWorkspace(ctx, async (id) => {
        const p = ctx.pyro;
        const sh = await p.openShell(id, { cols: 80, rows: 24 });
        expect(sh).toMatchObject({
          workspace_id: id,
          state: "running",
          cwd: "/workspace",
          cols: 80,
          rows: 24,
        });

        // A coloured word: plain has no ESC byte and the word as text; raw from the same cursor has the colour.
        await p.writeShell(id, sh.shell_id, "printf '\\033[31mRED\\033[0m-text\\n'");
        const colour = await p.readShell(id, sh.shell_id, { plain: true, waitForIdleMs: 500 });
        expect(colour.output).toMatch(/^RED-text$/m);
        expect(colour.output).not.toContain(ESC);
        const raw = await p.readShell(id, sh.shell_id, { cursor: colour.cursor });
        expect(raw.output).toContain(`${ESC}[31mRED`);
        expect(raw.next_cursor).toBe(colour.next_cursor);

        // A carriage-return progress bar collapses to its last state.
        const bar = await run(
          p,
          id,
          sh.shell_id,
          'for i in 1 2 3 4 5; do printf "\\rprogress $i/5"; sleep 0.05; done; echo; echo bar-done',
          800,
        );
        expect(bar).toMatch(/^progress 5\/5$/m);
        expect(bar).not.toMatch(/progress [1-4]\/5/);
        expect(bar).toContain("bar-done");

        // Idle batching: output with a pause shorter than the idle wait comes back in one read.
        const batch = await run(p, id, sh.shell_id, "echo first-part; sleep 0.3; echo second-part", 2000);
        expect(batch).toContain("first-part");
        expect(batch).toContain("second-part");

        // Cursors: a read past the end is refused; an old cursor rereads the same bytes.
        const end = (await p.readShell(id, sh.shell_id)).next_cursor;
        expect(await code(p.readShell(id, sh.shell_id, { cursor: end + 1000 }))).toBe("invalid_argument");
        const again = await p.readShell(id, sh.shell_id, { cursor: raw.cursor });
        expect(again.output.startsWith(raw.output.slice(0, 40))).toBe(true);

        // Resize: the program in the shell sees the new size.
        expect(await p.resizeShell(id, sh.shell_id, 100, 30)).toMatchObject({ cols: 100, rows: 30 });
        expect(await run(p, id, sh.shell_id, "stty size")).toMatch(/^30 100$/m);

        // A full-screen program: the screen as shown, not the command that drew it.
        const screen = await run(
          p,
          id,
          sh.shell_id,
          "printf '\\033[?1049h\\033[H\\033[2JTOP-LINE\\033[3;1HTHIRD-LINE'; sleep 0.2",
        );
        expect(screen).toMatch(/^TOP-LINE$/m);
        expect(screen).toMatch(/^THIRD-LINE/m);
        expect(screen).not.toContain("printf");
        await run(p, id, sh.shell_id, "printf '\\033[?1049l'; clear");

        // On a real backend the shell is in the sandbox: another process reads and writes it.
        if (ctx.target.real) {
          const w = cliPyro(
            ["workspace", "shell", "write", id, sh.shell_id, "--input", "echo from-cli-$((3*3))"],
            ctx.cliEnv,
          );
          expect(w.code, w.stderr).toBe(0);
          const r = cliPyro(
            ["workspace", "shell", "read", id, sh.shell_id, "--plain", "--wait-for-idle-ms", "500", "--json"],
            ctx.cliEnv,
          );
          expect(r.code, r.stderr).toBe(0);
          expect(r.json().output).toContain("from-cli-9");
        }

        // INT ends the foreground job and abandons the rest of its line.
        await p.writeShell(id, sh.shell_id, "sleep 60; echo after-$((1+1))");
        await p.readShell(id, sh.shell_id, { waitForIdleMs: 300 });
        const sig = await p.signalShell(id, sh.shell_id, "INT");
        expect(sig).toMatchObject({ signal: "INT", state: "running" });
        const back = await run(p, id, sh.shell_id, "echo back-$((2+2))");
        expect(back).toContain("back-4");
        expect(back).not.toContain("after-2");

        // Close ends it; it is gone from the list, and reading it is not_found.
        const closed = await p.closeShell(id, sh.shell_id);
        expect(closed).toMatchObject({ state: "exited", closed: true });
        expect((await p.listShells(id)).count).toBe(0);
        expect(await code(p.readShell(id, sh.shell_id))).toBe("not_found");
      }),
  },
  {
    name: "shells: bad input is a structured error and opens or changes nothing",
    run: (ctx) =>
      withWorkspace(ctx, async (id) => {
        const p = ctx.pyro;
        const ws = p.engine.workspaces;
        const { openShell, readShell, resizeShell, signalShell, writeShell } = await import(
          "../../src/core/shells.js"
        );
        expect(await code(readShell(ws, id, "sh_0123456789ab"))).toBe("not_found");
        expect(await code(writeShell(ws, id, "sh_0123456789ab", "ls"))).toBe("not_found");
        expect(await code(readShell(ws, id, "not-a-shell"))).toBe("invalid_argument");
        expect(await code(openShell(ws, id, { cols: 0 }))).toBe("invalid_argument");
        expect(await code(openShell(ws, id, { rows: -3 }))).toBe("invalid_argument");
        expect(await code(openShell(ws, id, { cwd: "../../etc" }))).toBe("path_outside_workspace");
        expect(await code(openShell(ws, "no-such-workspace"))).toBe("workspace_not_found");
        expect((await p.listShells(id)).count).toBe(0);
        const sh = await p.openShell(id);
        expect(await code(readShell(ws, id, sh.shell_id, { cursor: -1 }))).toBe("invalid_argument");
        expect(await code(readShell(ws, id, sh.shell_id, { wait_for_idle_ms: 60_000 }))).toBe(
          "invalid_argument",
        );
        expect(await code(signalShell(ws, id, sh.shell_id, "HUP"))).toBe("invalid_argument");
        expect(await code(resizeShell(ws, id, sh.shell_id, 80, 0))).toBe("invalid_argument");
        expect(await code(writeShell(ws, id, sh.shell_id, "x".repeat(70_000)))).toBe("invalid_argument");
        // Still one shell, running, with its size as opened.
        expect((await p.listShells(id)).shells).toMatchObject([
          { shell_id: sh.shell_id, state: "running", cols: 120, rows: 40 },
        ]);
      }),
  },
  {
    name: "shells: a stop, a start and a reset end every shell and what runs in it",
    run: (ctx) =>
      withWorkspace(ctx, async (id) => {
        const p = ctx.pyro;
        const hostPids = !ctx.target.real || ctx.target.backend === "host";
        const a = await p.openShell(id);
        await run(p, id, a.shell_id, "sleep 600 &");
        await p.stopWorkspace(id);
        await p.startWorkspace(id);
        expect((await p.listShells(id)).count).toBe(0);
        expect(await code(p.readShell(id, a.shell_id))).toBe("not_found");
        if (hostPids && a.pid !== null) expect(await alive(a.pid)).toBe(false);

        const b = await p.openShell(id);
        await run(p, id, b.shell_id, "echo in-b");
        await p.resetWorkspace(id);
        expect((await p.listShells(id)).count).toBe(0);
        expect(await code(p.readShell(id, b.shell_id))).toBe("not_found");
        if (hostPids && b.pid !== null) expect(await alive(b.pid)).toBe(false);
        // A new shell works after both.
        const c = await p.openShell(id);
        expect(await run(p, id, c.shell_id, "echo again-$((5+5))")).toContain("again-10");
      }),
  },
];
