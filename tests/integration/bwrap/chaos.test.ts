import { existsSync, readdirSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pyro } from "../../helpers/cli.js";
import {
  bwrapSkipReason,
  ENV_CACHE,
  exited,
  hostProcesses,
  spawnCli,
  suiteTitle,
} from "../../helpers/sandbox.js";

/**
 * Chaos: the CLI is SIGKILLed at a random moment of a create, a reset, a start or a
 * delete; the next CLI call must find every workspace usable or cleanly gone, with no
 * sandbox process, cgroup or directory left for a gone one. Seeded, so a failure names
 * the seed and the iteration that broke it.
 */
const skip = bwrapSkipReason();
const ITERATIONS = 16;

/** A small deterministic PRNG (mulberry32), so a failing run can be replayed from its seed. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function cgroupsOf(id: string): string[] {
  const root = "/sys/fs/cgroup";
  const found: string[] = [];
  for (const c of readdirSync(root)) {
    for (const p of [join(root, c, "pyro", id), join(root, "pyro", id)])
      if (existsSync(p) && !found.includes(p)) found.push(p);
  }
  return found;
}

describe.skipIf(skip !== "")(suiteTitle("chaos on bwrap (killed CLI calls)", skip), () => {
  let home: string;
  let env: NodeJS.ProcessEnv;
  const seed = Number(process.env.PYRO_CHAOS_SEED ?? Date.now() % 1_000_000);
  const random = rng(seed);

  beforeAll(async () => {
    home = await mkdtemp(join(tmpdir(), "pyro-chaos-"));
    env = { PYRO_HOME: home, PYRO_ENV_CACHE: ENV_CACHE, PYRO_BACKEND: "bwrap" };
  });
  afterAll(async () => {
    const list = pyro(["workspace", "list", "--json"], env);
    if (list.code === 0)
      for (const w of list.json().workspaces as { workspace_id: string }[])
        pyro(["workspace", "delete", w.workspace_id], env);
    await rm(home, { recursive: true, force: true });
  });

  it(`leaves every workspace usable or cleanly gone after ${ITERATIONS} killed calls (seed ${seed})`, {
    timeout: 600_000,
  }, async () => {
    const ops = ["create", "reset", "start", "delete"] as const;
    const gone = new Set<string>();
    for (let i = 0; i < ITERATIONS; i++) {
      const op = ops[i % ops.length]!;
      const where = `seed ${seed}, iteration ${i} (${op})`;
      // A workspace to act on (create makes its own).
      let target = "";
      if (op !== "create") {
        const made = pyro(["workspace", "create", "debian:12", "--id-only"], env);
        expect(made.code, `${where}: ${made.stderr}`).toBe(0);
        target = made.stdout.trim();
        pyro(["workspace", "exec", target, "--", "sh", "-c", "echo kept > kept.txt"], env);
        if (op === "start") expect(pyro(["workspace", "stop", target], env).code).toBe(0);
      }
      const args =
        op === "create"
          ? ["workspace", "create", "debian:12", "--name", `chaos-${i}`]
          : op === "reset"
            ? ["workspace", "reset", target]
            : op === "start"
              ? ["workspace", "start", target]
              : ["workspace", "delete", target];
      const child = spawnCli(args, env);
      await new Promise((r) => setTimeout(r, 50 + Math.floor(random() * 1200)));
      child.kill("SIGKILL");
      await exited(child);

      // The next client: listing recovers what the killed one left half-done.
      const list = pyro(["workspace", "list", "--json"], env);
      expect(list.code, `${where}: ${list.stderr}`).toBe(0);
      const listed = list.json().workspaces as { workspace_id: string; state: string }[];
      for (const w of listed) {
        expect(["running", "stopped"], `${where}: ${w.workspace_id} is ${w.state}`).toContain(w.state);
        if (w.state === "stopped") expect(pyro(["workspace", "start", w.workspace_id], env).code).toBe(0);
        const r = pyro(["workspace", "exec", w.workspace_id, "--", "echo", "usable"], env);
        expect(r.code, `${where}: ${w.workspace_id}: ${r.stderr}`).toBe(0);
        expect(r.stdout).toBe("usable\n");
      }
      const ids = new Set(listed.map((w) => w.workspace_id));
      if (target && !ids.has(target)) gone.add(target);
      // Nothing on disk but listed workspaces.
      const wsDir = join(home, "workspaces");
      const dirs = existsSync(wsDir) ? readdirSync(wsDir).filter((n) => n.startsWith("ws_")) : [];
      for (const d of dirs) expect(ids.has(d), `${where}: directory ${d} without a workspace`).toBe(true);
      // Keep the number of live sandboxes small on a 2-core machine.
      for (const w of listed) {
        pyro(["workspace", "delete", w.workspace_id], env);
        gone.add(w.workspace_id);
      }
    }
    // Nothing of any gone workspace is left running or holding a cgroup.
    for (const id of gone) {
      expect(cgroupsOf(id), `cgroups of ${id}`).toEqual([]);
      expect(
        hostProcesses((argv) => argv.some((a) => a.includes(id))),
        `processes of ${id}`,
      ).toEqual([]);
    }
  });
});
