import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { expect } from "vitest";
import { REPO_ROOT } from "./cli.js";
import type { Harness } from "./sandbox.js";

/**
 * What the pool tests of every backend (tests/integration/{bwrap,gvisor,docker}/pool.test.ts)
 * read: the spares on disk, a spare's recorded sandbox state, and of a harness, a command's
 * output, how a workspace was created (`pool` or its own sandbox) and its recorded state,
 * plus why spares declined (the engine's sandbox warnings).
 */

/** The spares on disk under `home`: every id with a record (`<id>.json`) or a directory. */
export async function sparesOf(home: string): Promise<string[]> {
  const names = await readdir(join(home, "pool")).catch(() => [] as string[]);
  // A spare's directory, its record (`.taken` while handed out) and the temporary file of
  // a record write its owner was killed in (`.spare_….json.<pid>.<random>.tmp`).
  const ids = names.map((n) => /spare_[0-9a-f]+/.exec(n)?.[0]).filter((id): id is string => id !== undefined);
  return [...new Set(ids)].sort();
}

/** The recorded sandbox state of a spare (its record in the pool directory). */
export async function spareState<T>(home: string, id: string): Promise<T> {
  return JSON.parse(await readFile(join(home, "pool", `${id}.json`), "utf8")).state as T;
}

/** Readers of the harness `harness()` returns once the suite opened it. */
export function poolProbe(harness: () => Harness) {
  const declined: string[] = [];
  return {
    /** Why spares declined workspaces (engine warnings): the message of a failed expectation. */
    declined,
    /** Collects the engine's sandbox warnings into `declined`; call once the harness is open. */
    watchDeclines() {
      harness().pyro.engine.events.on((e) => {
        if (e.level === "warning" && e.kind === "sandbox") declined.push(e.message);
      });
    },
    /** Runs `command` in the workspace, expects exit 0, returns its trimmed stdout. */
    async sh(id: string, command: string): Promise<string> {
      const r = await harness().pyro.execWorkspace(id, command);
      expect(r.exit_code, `\`${command}\` failed: ${r.stderr}`).toBe(0);
      return r.stdout.trim();
    },
    /** The create event's detail: `sandbox` is `pool` for a hand-out. */
    createEvent(id: string) {
      return harness()
        .pyro.engine.store()
        .listEvents(id)
        .find((e) => e.kind === "create")?.detail as { sandbox?: string } | undefined;
    },
    /** The workspace's recorded sandbox state. */
    recorded<T>(id: string): T {
      return harness().pyro.engine.store().getWorkspace(id)?.runtime.sandbox as T;
    },
  };
}

/**
 * An ES module script for `node --input-type=module -e`: an SDK process (dist/) that
 * starts its pool, waits for its spares, prints `ready N`, runs `then` (more lines, e.g.
 * a create) and stays alive to be killed like a `mcp serve`.
 */
export function poolOwnerScript(then: string[] = []): string {
  return [
    `import { Pyro } from ${JSON.stringify(join(REPO_ROOT, "dist", "sdk", "pyro.js"))};`,
    "const pyro = new Pyro();",
    "await pyro.engine.warmPool();",
    "await pyro.engine.pool.ready();",
    "console.log('ready ' + pyro.engine.pool.readyCount);",
    ...then,
    "setInterval(() => {}, 1000);",
  ].join("\n");
}
