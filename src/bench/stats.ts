/** Small helpers for benchmarks: medians over repeated runs and a printed table. */
export async function medianMs(runs: number, fn: () => Promise<unknown>, warmup = 1): Promise<number> {
  for (let i = 0; i < warmup; i++) await fn();
  const times: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t = performance.now();
    await fn();
    times.push(performance.now() - t);
  }
  return median(times);
}

/** Median of a list of numbers (the mean of the middle two for an even count). */
export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
}

export interface BenchRow {
  name: string;
  value_ms: number;
  floor_name: string;
  floor_ms: number;
  /** value / floor, or floor / value for throughput rows (`higher_is_better`). */
  ratio: number;
  target: string;
  pass: boolean | null;
  note?: string;
}

export function row(
  name: string,
  valueMs: number,
  floorName: string,
  floorMs: number,
  target: { max?: number; min?: number; inverse?: boolean },
  note?: string,
): BenchRow {
  const ratio = target.inverse ? floorMs / valueMs : valueMs / floorMs;
  const pass =
    target.max !== undefined ? ratio <= target.max : target.min !== undefined ? ratio >= target.min : null;
  const t =
    target.max !== undefined ? `≤ ${target.max}×` : target.min !== undefined ? `≥ ${target.min}×` : "-";
  return {
    name,
    value_ms: round(valueMs),
    floor_name: floorName,
    floor_ms: round(floorMs),
    ratio: round(ratio, 3),
    target: t,
    pass,
    ...(note ? { note } : {}),
  };
}

export function round(n: number, digits = 2): number {
  const f = 10 ** digits;
  return Math.round(n * f) / f;
}

export function printTable(rows: BenchRow[]): string {
  const head = ["benchmark", "median", "floor", "floor median", "ratio", "target", "ok"];
  const body = rows.map((r) => [
    r.name,
    `${r.value_ms} ms`,
    r.floor_name,
    `${r.floor_ms} ms`,
    `${r.ratio}×`,
    r.target,
    r.pass === null ? "-" : r.pass ? "yes" : "NO",
  ]);
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((b) => b[i]!.length)));
  const fmt = (cells: string[]) => cells.map((c, i) => c.padEnd(widths[i]!)).join("  ");
  return [fmt(head), fmt(widths.map((w) => "-".repeat(w))), ...body.map(fmt)].join("\n");
}
