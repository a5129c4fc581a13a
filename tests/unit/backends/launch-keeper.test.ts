import { describe, expect, it } from "vitest";
import { preparedLaunchArgv, preparedRunArgs } from "../../../src/backends/bwrap/prepared-launch.js";
import { type Kept, LaunchKeeper } from "../../../src/backends/launch-keeper.js";
import { BUSYBOX_TOOLS } from "../../../src/backends/linux/launch.js";

/** A kept launch that records whether it was closed. */
function fake(name: string, closed: string[]): Kept & { name: string } {
  return {
    name,
    close: async () => {
      closed.push(name);
    },
  };
}

describe("LaunchKeeper", () => {
  it("hands a prepared launch out once, and prepares nothing while one is kept", async () => {
    const k = new LaunchKeeper();
    const closed: string[] = [];
    let made = 0;
    k.prepare("a", async () => fake(`a${++made}`, closed));
    k.prepare("a", async () => fake(`a${++made}`, closed));
    await k.ready();
    expect(made).toBe(1);
    expect((await k.take<Kept & { name: string }>("a"))?.name).toBe("a1");
    expect(await k.take("a")).toBeNull();
    await k.close();
    expect(closed).toEqual([]); // taken: its taker closes it
  });

  it("keeps two keys at most, ending the one run on least recently", async () => {
    const k = new LaunchKeeper();
    const closed: string[] = [];
    for (const key of ["a", "b", "c"]) k.prepare(key, async () => fake(key, closed));
    await k.ready();
    expect(closed).toEqual(["a"]);
    expect(await k.take("a")).toBeNull();
    await k.close();
    expect(closed.sort()).toEqual(["a", "b", "c"]);
  });

  it("stops preparing a key after two failures in a row, and says why", async () => {
    const k = new LaunchKeeper();
    let tries = 0;
    for (let i = 0; i < 4; i++) {
      k.prepare("a", async () => {
        tries++;
        throw new Error("no loop device");
      });
      await k.ready();
      expect(await k.take("a")).toBeNull();
    }
    expect(tries).toBe(2);
    expect(k.lastError).toBe("no loop device");
  });

  it("ends what is being prepared when closed, and prepares nothing after", async () => {
    const k = new LaunchKeeper();
    const closed: string[] = [];
    let release = () => {};
    k.prepare("a", () => new Promise<Kept>((ok) => (release = () => ok(fake("a", closed)))));
    const closing = k.close();
    release();
    await closing;
    expect(closed).toEqual(["a"]);
    k.prepare("b", async () => fake("b", closed));
    expect(await k.take("b")).toBeNull();
  });
});

describe("prepared launch argv", () => {
  const paths = {
    image: "/h/run_1/disk.img",
    diskMount: "/h/run_1/disk",
    upper: "/h/run_1/disk/upper",
    work: "/h/run_1/disk/work",
    lower: "/env/rootfs",
    merged: "/h/run_1/merged",
    argsFile: "/h/run_1/args",
    dir: "/h/run_1",
    cgroups: [{ dir: "/sys/fs/cgroup/pids/pyro/run_1", rootProcs: "/sys/fs/cgroup/pids/cgroup.procs" }],
  };

  it("passes every path as an argument, never in the script's text", () => {
    const argv = preparedLaunchArgv(paths, ["bwrap", "--bind", paths.merged, "/"], BUSYBOX_TOOLS);
    const script = argv[argv.indexOf("-c") + 1]!;
    for (const v of [paths.image, paths.lower, paths.argsFile, paths.dir, "/sys/fs/cgroup"])
      expect(script).not.toContain(v);
    expect(argv.slice(argv.indexOf("pyro-prepared-launch") + 1)).toEqual([
      paths.image,
      paths.diskMount,
      paths.upper,
      paths.work,
      paths.lower,
      paths.merged,
      paths.argsFile,
      paths.dir,
      paths.cgroups[0]!.dir,
      paths.cgroups[0]!.rootProcs,
      "",
      "",
      "",
      "",
      "bwrap",
      "--bind",
      paths.merged,
      "/",
    ]);
    expect(script).toContain('--args 4 -- /bin/sh -c "$cmd"');
  });

  it("writes the command first, then --setenv pairs, each NUL-terminated", () => {
    const b = preparedRunArgs("echo 'a'\nexit 3\n", { K: "v w", "A B": "$(x)" });
    expect(b.toString("utf8").split("\0")).toEqual([
      "echo 'a'\nexit 3\n",
      "--setenv",
      "K",
      "v w",
      "--setenv",
      "A B",
      "$(x)",
      "",
    ]);
  });
});
