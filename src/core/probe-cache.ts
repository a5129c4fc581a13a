/**
 * Backend probes remembered across processes (issue 18: a CLI create or run chose its
 * backend by probing, which starts a sandbox: ~40-90 ms for bwrap, ~200 ms for runsc,
 * on every call). A probe that proved a backend works is kept in `<home>/probe/
 * verdicts.json` for {@link PROBE_TTL_MS}, and only while what it proved is unchanged:
 * the same binary (path, size, modification time), kernel, user and PATH.
 *
 * Only a working verdict is kept, and only for the backends whose verdict rests on a
 * local binary and the kernel (bwrap, gVisor): a refusal is probed again every time (a
 * fix shows at once), as is Docker (an engine that may stop) and what needs KVM. A kept
 * verdict that has gone wrong within its lifetime fails closed all the same: the sandbox
 * itself then does not start, with the backend's own error. `pyro doctor` always probes
 * and refreshes what is kept.
 */
import { mkdir, readFile, stat } from "node:fs/promises";
import { release } from "node:os";
import { join } from "node:path";
import type { BackendName, ProbeResult } from "../backends/backend.js";
import { atomicWriteFile } from "../util/fs.js";

/** How long a working verdict is trusted without probing. */
export const PROBE_TTL_MS = 10 * 60_000;
const CACHEABLE: ReadonlySet<BackendName> = new Set(["bwrap", "gvisor"]);

type Verdict = Omit<ProbeResult, "name" | "isolation" | "probe_ms">;

interface Kept {
  at: number;
  /** What the verdict rests on; any change means a new probe. */
  basis: string;
  verdict: Verdict;
}

/** Where the verdicts of a home are kept. */
export function verdictsFile(home: string): string {
  return join(home, "probe", "verdicts.json");
}

async function basisOf(verdict: Verdict, env: NodeJS.ProcessEnv): Promise<string | null> {
  const bin = verdict.details?.path;
  if (typeof bin !== "string") return null;
  const st = await stat(bin).catch(() => null);
  if (!st) return null;
  return JSON.stringify([bin, st.size, st.mtimeMs, st.ino, release(), process.getuid?.(), env.PATH ?? ""]);
}

async function readKept(file: string): Promise<Record<string, Kept>> {
  try {
    const parsed = JSON.parse(await readFile(file, "utf8"));
    return parsed && typeof parsed === "object" ? (parsed as Record<string, Kept>) : {};
  } catch {
    return {};
  }
}

/**
 * The verdict of `name`'s probe: the kept one when it still holds, else `probe()`'s
 * (kept when it is a working verdict of a cacheable backend).
 */
export async function cachedProbe(
  name: BackendName,
  file: string,
  env: NodeJS.ProcessEnv,
  probe: () => Promise<Verdict>,
  now: () => number = Date.now,
): Promise<Verdict> {
  if (!CACHEABLE.has(name)) return probe();
  const kept = (await readKept(file))[name];
  if (kept && now() - kept.at < PROBE_TTL_MS && kept.at <= now() && kept.verdict?.available === true) {
    if ((await basisOf(kept.verdict, env)) === kept.basis) return kept.verdict;
  }
  const verdict = await probe();
  await keepVerdict(name, file, env, verdict, now).catch(() => {});
  return verdict;
}

/** Keeps a fresh probe's verdict (a working one of a cacheable backend; a refusal forgets). */
export async function keepVerdict(
  name: BackendName,
  file: string,
  env: NodeJS.ProcessEnv,
  verdict: Verdict,
  now: () => number = Date.now,
): Promise<void> {
  if (!CACHEABLE.has(name)) return;
  const all = await readKept(file);
  const basis = verdict.available ? await basisOf(verdict, env) : null;
  if (basis) all[name] = { at: now(), basis, verdict };
  else if (all[name]) delete all[name];
  else return;
  await mkdir(join(file, ".."), { recursive: true, mode: 0o700 });
  await atomicWriteFile(file, JSON.stringify(all), 0o600);
}
