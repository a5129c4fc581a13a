import { describe, expect, it } from "vitest";
import {
  goalText,
  judge,
  median,
  missedRows,
  pairedSampleMs,
  printTable,
  quantile,
  row,
  verdictText,
} from "../../../src/bench/stats.js";

/** Samples around `m` with a given spread: m-s, m-s/2, m, m+s/2, m+s (quartiles m∓s/2). */
const around = (m: number, s: number) => [m - s, m - s / 2, m, m + s / 2, m + s];

describe("bench statistics", () => {
  it("takes a paired row's samples alternately with its floor's, the floor first, after the warm-up", async () => {
    const order: string[] = [];
    const r = await pairedSampleMs(
      3,
      async () => order.push("value"),
      async () => order.push("floor"),
      2,
    );
    expect(order).toEqual(["value", "value", "floor", "value", "floor", "value", "floor", "value"]);
    expect(r.value).toHaveLength(3);
    expect(r.floor).toHaveLength(3);
  });

  it("quantiles interpolate between order statistics; the median of an even count is the middle mean", () => {
    expect(median([3, 1, 2])).toBe(2);
    expect(median([4, 1, 3, 2])).toBe(2.5);
    expect(quantile([10, 20, 30, 40, 50], 0.25)).toBe(20);
    expect(quantile([10, 20], 0.75)).toBe(17.5);
    expect(quantile([7], 0.25)).toBe(7);
  });

  it("prints each kind of goal", () => {
    expect(goalText({ max: 1.5 })).toBe("≤ 1.5×");
    expect(goalText({ min: 0.8, inverse: true })).toBe("≥ 0.8×");
    expect(goalText({ maxAbs: 100 })).toBe("≤ 100 ms");
    expect(goalText({ maxAbs: 30, unit: "MiB" })).toBe("≤ 30 MiB");
    expect(goalText({ maxOverFloor: 200 })).toBe("≤ floor + 200 ms");
    expect(goalText({})).toBe("-");
  });
});

describe("judge: a goal met, missed within the noise, or missed beyond it", () => {
  it("ratio ≤ goal: a tight row over the goal misses; a noisy one over it by less than its spread does not", () => {
    // Medians 110 / 100 = 1.1 against ≤ 1×.
    const tight = judge(around(110, 2), around(100, 2), { max: 1 });
    expect(tight).toMatchObject({ pass: false, missed: true });
    expect(tight.ratio).toBeCloseTo(1.1);
    // Same medians, value quartiles 90..130: its lower quartile / the floor's upper is ≤ 1.
    expect(judge(around(110, 40), around(100, 2), { max: 1 })).toMatchObject({ pass: false, missed: false });
    // The floor's spread counts too: floor quartiles 85..115.
    expect(judge(around(110, 2), around(100, 30), { max: 1 })).toMatchObject({ pass: false, missed: false });
    expect(judge(around(90, 2), around(100, 2), { max: 1 })).toMatchObject({ pass: true, missed: false });
  });

  it("throughput rows (floor / value ≥ goal) use the favourable quartiles the other way round", () => {
    // tar | tar 100 ms, sync 200 ms: 0.5× against ≥ 0.8×.
    expect(judge(around(200, 4), around(100, 2), { min: 0.8, inverse: true })).toMatchObject({
      ratio: 0.5,
      pass: false,
      missed: true,
    });
    // 130 ms with quartiles 90..170: 102 / 90 ≥ 0.8 at its best.
    expect(judge(around(130, 80), around(100, 4), { min: 0.8, inverse: true })).toMatchObject({
      pass: false,
      missed: false,
    });
    expect(judge(around(110, 2), around(100, 2), { min: 0.8, inverse: true })).toMatchObject({
      pass: true,
      missed: false,
    });
  });

  it("absolute goals compare the value alone; the floor does not matter", () => {
    expect(judge(around(120, 10), [1], { maxAbs: 100 })).toMatchObject({ pass: false, missed: true });
    expect(judge(around(105, 20), [1], { maxAbs: 100 })).toMatchObject({ pass: false, missed: false });
    expect(judge(around(80, 10), [1000], { maxAbs: 100 })).toMatchObject({ pass: true, missed: false });
  });

  it("floor + offset goals (qemu reset ≤ restore + 200 ms) allow for both spreads", () => {
    expect(judge(around(800, 10), around(470, 10), { maxOverFloor: 200 })).toMatchObject({
      pass: false,
      missed: true,
    });
    // Value quartiles 660..740, floor quartiles 445..495: 660 ≤ 495 + 200.
    expect(judge(around(700, 80), around(470, 50), { maxOverFloor: 200 })).toMatchObject({
      pass: false,
      missed: false,
    });
    expect(judge(around(600, 10), around(470, 10), { maxOverFloor: 200 })).toMatchObject({ pass: true });
  });

  it("a value given as one median has no spread: it misses when the median misses", () => {
    expect(judge(101, 100, { max: 1 })).toMatchObject({ pass: false, missed: true });
    expect(judge(99, 100, { max: 1 })).toMatchObject({ pass: true, missed: false });
  });

  it("rows without a goal are neither passed nor missed", () => {
    expect(judge(around(500, 5), around(1, 0), {})).toMatchObject({ pass: null, missed: null });
  });
});

describe("rows and --check", () => {
  const rows = [
    row("met", around(90, 2), "floor", around(100, 2), { max: 1 }),
    row("noisy", around(110, 40), "floor", around(100, 2), { max: 1 }),
    row("missed", around(200, 2), "floor", around(100, 2), { max: 1.5 }),
    row("no goal", around(200, 2), "floor", around(100, 2), {}),
    row("rss", [40, 41, 40], "idle node", 45, { maxAbs: 30, unit: "MiB" }),
  ];

  it("keeps medians, sample counts and spreads, and prints the goal and verdict beside the ratio", () => {
    expect(rows[1]).toMatchObject({
      value_ms: 110,
      floor_ms: 100,
      ratio: 1.1,
      samples: [5, 5],
      iqr: [40, 2],
    });
    expect(rows.map(verdictText)).toEqual(["yes", "noise", "NO", "-", "NO"]);
    const table = printTable(rows);
    expect(table).toMatch(/missed\s+200 ms\s+floor\s+100 ms\s+2×\s+≤ 1\.5×\s+NO/);
    expect(table).toMatch(/rss\s+40 MiB\s+idle node\s+45 MiB\s+0\.889×\s+≤ 30 MiB\s+NO/);
  });

  it("--check fails on exactly the rows that miss beyond noise", () => {
    expect(missedRows(rows).map((r) => r.name)).toEqual(["missed", "rss"]);
    expect(missedRows(rows.slice(0, 2))).toEqual([]);
  });
});
