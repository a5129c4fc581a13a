import { describe, expect, it } from "vitest";
import type { BuildProgress } from "../../../src/env/builder.js";
import { findEnvironment } from "../../../src/env/catalog.js";
import { DebootstrapBuilder, PhaseTracker } from "../../../src/env/debootstrap.js";

describe("debootstrap builder", () => {
  it("builds the exact argv for an environment recipe", () => {
    const b = new DebootstrapBuilder({ debCacheDir: "/c/.debs" });
    expect(b.argv(findEnvironment("debian:12"), "/t/rootfs", "http://m/debian")).toEqual([
      "debootstrap",
      "--variant=minbase",
      "--arch=amd64",
      "--cache-dir=/c/.debs",
      "--include=ca-certificates,curl,git,make,python3",
      "bookworm",
      "/t/rootfs",
      "http://m/debian",
    ]);
    expect(b.argv(findEnvironment("debian:12-base"), "/t", "http://m")).not.toContainEqual(
      expect.stringMatching(/^--include/),
    );
  });

  it("turns debootstrap's output into phases with package counts", () => {
    const seen: BuildProgress[] = [];
    const t = new PhaseTracker((p) => seen.push(p));
    for (const l of [
      "I: Retrieving InRelease ",
      "I: Retrieving Packages ",
      "I: Retrieving adduser 3.134",
      "I: Retrieving apt 2.6.1",
      "I: Extracting zlib1g...",
      "I: Unpacking libc6...",
      "I: Unpacking bash...",
      "W: something unrelated",
      "I: Configuring apt...",
      "I: Base system installed successfully.",
    ])
      t.line(l);
    expect(seen.map((p) => p.phase)).toEqual([
      "retrieve",
      "retrieve",
      "retrieve",
      "retrieve",
      "extract",
      "unpack",
      "unpack",
      "configure",
      "finish",
    ]);
    expect(seen[3]?.count).toBe(2);
    expect(seen[6]?.count).toBe(2);
    t.size(1234);
    expect(seen.at(-1)?.bytes).toBe(1234);
  });
});
