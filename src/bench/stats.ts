/**
 * Small helpers for benchmarks: samples over repeated runs, rows with their goal, the
 * `--check` verdict and a printed table. The goal and check logic is pure (tested with
 * synthetic samples in tests/unit/bench/stats.test.ts); only sampleMs times anything.
 */

/** Times `fn` `runs` times after `warmup` untimed calls; the samples in milliseconds. */
export async function sampleMs(runs: number, fn: () => Promise<unknown>, warmup = 1): Promise<number[]> {
  for (let i = 0; i < warmup; i++) await fn();
  const times: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t = performance.now();
    await fn();
    times.push(performance.now() - t);
  }
  return times;
}

/**
 * Samples `fn` and `floor` alternately, `runs` of each (the floor first): a load that
 * swings while they are taken hits both alike, so their ratio holds where a floor taken
 * minutes before, in another load, would not (the warm exec row swung from 0.15x to 2x
 * over an hour of a busy machine that way).
 */
export async function pairedSampleMs(
  runs: number,
  fn: () => Promise<unknown>,
  floor: () => Promise<unknown>,
  warmup = 1,
): Promise<{ value: number[]; floor: number[] }> {
  for (let i = 0; i < warmup; i++) await fn();
  const value: number[] = [];
  const floorMs: number[] = [];
  for (let i = 0; i < runs; i++) {
    floorMs.push(...(await sampleMs(1, floor, 0)));
    value.push(...(await sampleMs(1, fn, 0)));
  }
  return { value, floor: floorMs };
}

export async function medianMs(runs: number, fn: () => Promise<unknown>, warmup = 1): Promise<number> {
  return median(await sampleMs(runs, fn, warmup));
}

/** Median of a list of numbers (the mean of the middle two for an even count). */
export function median(xs: readonly number[]): number {
  return quantile(xs, 0.5);
}

/** The q-quantile (0..1) with linear interpolation between order statistics. */
export function quantile(xs: readonly number[], q: number): number {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  const pos = (s.length - 1) * q;
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return s[lo]! + (s[hi]! - s[lo]!) * (pos - lo);
}

/**
 * A row's goal, where an issue names one (at most one kind per row):
 * - `max` / `min`: the ratio value / floor must be ≤ max or ≥ min; with `inverse` the
 *   ratio is floor / value (throughput rows: a time half the floor's is 2×);
 * - `maxAbs`: the value itself must be ≤ maxAbs (in the row's unit), the floor is context;
 * - `maxOverFloor`: the value must be ≤ floor + maxOverFloor (same unit).
 */
export interface Target {
  max?: number;
  min?: number;
  inverse?: boolean;
  maxAbs?: number;
  maxOverFloor?: number;
  /** What the numbers are; "ms" unless said. */
  unit?: "ms" | "MiB";
}

export interface BenchRow {
  name: string;
  /** Median of the value's samples, in `unit` (the name is historical: ms unless unit says). */
  value_ms: number;
  floor_name: string;
  floor_ms: number;
  unit: "ms" | "MiB";
  /** value / floor, or floor / value for throughput rows (`inverse`). */
  ratio: number;
  /** The goal in words (`≤ 2×`, `≤ 100 ms`, `≤ floor + 200 ms`), or `-`. */
  target: string;
  /** Whether the medians meet the goal; null without one. */
  pass: boolean | null;
  /**
   * Whether the row misses its goal by more than the noise of its samples (the `--check`
   * rule, see judge()); null without a goal.
   */
  missed: boolean | null;
  /** How many samples value and floor had (1: a median measured elsewhere, no spread known). */
  samples: [number, number];
  /** Interquartile range of value and floor: the noise the check allows for. */
  iqr: [number, number];
  note?: string;
}

export type Samples = number | readonly number[];

const list = (s: Samples): readonly number[] => (typeof s === "number" ? [s] : s);

/** The goal in words. */
export function goalText(t: Target): string {
  const u = t.unit ?? "ms";
  if (t.maxAbs !== undefined) return `≤ ${t.maxAbs} ${u}`;
  if (t.maxOverFloor !== undefined) return `≤ floor + ${t.maxOverFloor} ${u}`;
  if (t.max !== undefined) return `≤ ${t.max}×`;
  if (t.min !== undefined) return `≥ ${t.min}×`;
  return "-";
}

/**
 * The verdict on a row's samples. `pass` compares the medians with the goal. `missed`
 * (the `--check` rule) compares the goal with the most favourable reading the noise
 * allows: the value at its 25th percentile (at its 75th where higher is better) against
 * the floor at its 75th (25th) percentile. So a row misses only when at least a quarter
 * of its runs would have to be faster than they were AND a quarter of its floor runs
 * slower, for it to meet the goal: the spread of the samples measured in this run is the
 * machine's noise. A value or floor given as a single median has no spread: its median
 * is used for both quartiles.
 */
export function judge(
  value: Samples,
  floor: Samples,
  t: Target,
): { ratio: number; pass: boolean | null; missed: boolean | null } {
  const v = list(value);
  const f = list(floor);
  const [v25, v50, v75] = [quantile(v, 0.25), median(v), quantile(v, 0.75)];
  const [f25, f50, f75] = [quantile(f, 0.25), median(f), quantile(f, 0.75)];
  const ratio = t.inverse ? f50 / v50 : v50 / f50;
  if (t.maxAbs !== undefined) return { ratio, pass: v50 <= t.maxAbs, missed: v25 > t.maxAbs };
  if (t.maxOverFloor !== undefined)
    return { ratio, pass: v50 <= f50 + t.maxOverFloor, missed: v25 > f75 + t.maxOverFloor };
  // The favourable ratio: lower for `max` goals, higher for `min` goals.
  const low = t.inverse ? f25 / v75 : v25 / f75;
  const high = t.inverse ? f75 / v25 : v75 / f25;
  if (t.max !== undefined) return { ratio, pass: ratio <= t.max, missed: low > t.max };
  if (t.min !== undefined) return { ratio, pass: ratio >= t.min, missed: high < t.min };
  return { ratio, pass: null, missed: null };
}

/** A row: value and floor as samples (or a median measured elsewhere), and its goal. */
export function row(
  name: string,
  value: Samples,
  floorName: string,
  floor: Samples,
  target: Target,
  note?: string,
): BenchRow {
  const v = list(value);
  const f = list(floor);
  const { ratio, pass, missed } = judge(v, f, target);
  const iqr = (xs: readonly number[]) => round(quantile(xs, 0.75) - quantile(xs, 0.25));
  return {
    name,
    value_ms: round(median(v)),
    floor_name: floorName,
    floor_ms: round(median(f)),
    unit: target.unit ?? "ms",
    ratio: round(ratio, 3),
    target: goalText(target),
    pass,
    missed,
    samples: [v.length, f.length],
    iqr: [iqr(v), iqr(f)],
    ...(note ? { note } : {}),
  };
}

/** The rows `--check` fails on: those that miss their goal by more than their noise. */
export function missedRows(rows: readonly BenchRow[]): BenchRow[] {
  return rows.filter((r) => r.missed === true);
}

export function round(n: number, digits = 2): number {
  const f = 10 ** digits;
  return Math.round(n * f) / f;
}

/** `yes` (met), `noise` (the median misses, within the noise), `NO` (missed), `-` (no goal). */
export function verdictText(r: Pick<BenchRow, "pass" | "missed">): string {
  if (r.pass === null) return "-";
  return r.pass ? "yes" : r.missed ? "NO" : "noise";
}

export function printTable(rows: readonly BenchRow[]): string {
  const head = ["benchmark", "median", "floor", "floor median", "ratio", "goal", "ok"];
  const body = rows.map((r) => [
    r.name,
    `${r.value_ms} ${r.unit}`,
    r.floor_name,
    `${r.floor_ms} ${r.unit}`,
    `${r.ratio}×`,
    r.target,
    verdictText(r),
  ]);
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((b) => b[i]!.length)));
  const fmt = (cells: string[]) =>
    cells
      .map((c, i) => c.padEnd(widths[i]!))
      .join("  ")
      .trimEnd();
  const notes = rows.filter((r) => r.note).map((r) => `  ${r.name}: ${r.note}`);
  return [
    fmt(head),
    fmt(widths.map((w) => "-".repeat(w))),
    ...body.map(fmt),
    ...(notes.length ? ["", "notes:", ...notes] : []),
  ].join("\n");
}
