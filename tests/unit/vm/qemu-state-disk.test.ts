import { execFileSync } from "node:child_process";
import { mkdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { qemuLayout } from "../../../src/backends/qemu/backend.js";
import { freshStateDisk } from "../../../src/backends/qemu/template.js";
import { which } from "../../../src/util/run.js";
import { tempDir } from "../agent/helpers.js";

const noQemuImg = (await which("qemu-img")) ? "" : "qemu-img is not installed";
const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const mtimeNs = async (p: string) => (await stat(p, { bigint: true })).mtimeNs;
const backingOf = (p: string) =>
  (
    JSON.parse(execFileSync("qemu-img", ["info", "--output=json", p], { encoding: "utf8" })) as {
      "backing-filename"?: string;
    }
  )["backing-filename"];

describe.skipIf(noQemuImg)(`qemu state disk${noQemuImg ? ` (skipped: ${noQemuImg})` : ""}`, () => {
  async function setup() {
    const t = await tempDir("pyro-qemu-disk-");
    cleanups.push(t.cleanup);
    const template = join(t.dir, "template-state.qcow2");
    execFileSync("qemu-img", ["create", "-q", "-f", "qcow2", template, "16M"]);
    const l = qemuLayout(join(t.dir, "ws"));
    await mkdir(join(t.dir, "ws"));
    return { l, template, dir: t.dir };
  }

  it("a reset's new state disk is a copy of the kept fresh overlay: the base is not copied again", async () => {
    const { l, template } = await setup();
    await freshStateDisk(l, template);
    expect(backingOf(l.stateDisk)).toBe(l.baseDisk);
    const base = await mtimeNs(l.baseDisk);
    const fresh = await mtimeNs(l.freshDisk);
    // A reset: the state disk goes, base and overlay stay.
    await rm(l.stateDisk);
    await freshStateDisk(l, template);
    expect(await mtimeNs(l.baseDisk)).toBe(base);
    expect(await mtimeNs(l.freshDisk)).toBe(fresh);
    expect(backingOf(l.stateDisk)).toBe(l.baseDisk);
    expect(await readFile(l.stateDisk)).toEqual(await readFile(l.freshDisk));
  });

  it("a rebuilt template (another file), a missing overlay or a missing base.id make a new base", async () => {
    const { l, template, dir } = await setup();
    await freshStateDisk(l, template);
    const firstId = await readFile(l.baseId, "utf8");
    // Rebuilt: a new file renamed into place, as ensureTemplate does.
    const rebuilt = join(dir, "rebuilt.qcow2");
    execFileSync("qemu-img", ["create", "-q", "-f", "qcow2", rebuilt, "32M"]);
    await rename(rebuilt, template);
    for (const breakIt of [async () => {}, () => rm(l.freshDisk), () => writeFile(l.baseId, "stale")]) {
      await rm(l.stateDisk);
      await breakIt();
      const base = await mtimeNs(l.baseDisk);
      await freshStateDisk(l, template);
      expect(await mtimeNs(l.baseDisk)).not.toBe(base);
      expect(await readFile(l.baseId, "utf8")).not.toBe(firstId);
      expect((await stat(l.baseDisk)).size).toBe((await stat(template)).size);
    }
  });
});
