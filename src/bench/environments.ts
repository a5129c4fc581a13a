import { type ChildProcess, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Pyro } from "../sdk/pyro.js";
import { run, which } from "../util/run.js";
import { type BenchRow, median, row } from "./stats.js";
import { createCostUs, creationNote } from "./sync.js";

/**
 * Environment rows: a pull of an image of about 100 MB (debian:12's root filesystem as
 * one gzip layer) from a registry on loopback (Debian's docker-registry) against
 * `skopeo copy` of the same image to a local directory (the raw floor: download and
 * verify, no unpacking; pyro also unpacks), and a workspace create (bwrap) from that
 * pulled image against one from the debootstrap environment it was made from.
 */
export async function environmentRows(o: { quick: boolean; log: (s: string) => void }): Promise<BenchRow[]> {
  for (const t of ["docker-registry", "skopeo", "tar", "gzip"]) {
    if (!(await which(t))) {
      o.log(`bench: environment rows skipped: ${t} is not installed`);
      return [];
    }
  }
  const dir = await mkdtemp(join(tmpdir(), "pyro-bench-env-"));
  const pyro = new Pyro({ home: join(dir, "home") });
  let registry: ChildProcess | null = null;
  try {
    const base = await pyro.pullEnvironment("debian:12");
    const port = await freePort();
    const host = `127.0.0.1:${port}`;
    await mkdir(join(dir, "registry"));
    await writeFile(
      join(dir, "registry.yml"),
      `version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: ${join(dir, "registry")}\nhttp:\n  addr: ${host}\n`,
    );
    registry = spawn("docker-registry", ["serve", join(dir, "registry.yml")], { stdio: "ignore" });
    for (let i = 0; i < 200; i++) {
      if (
        await fetch(`http://${host}/v2/`).then(
          (r) => r.ok,
          () => false,
        )
      )
        break;
      await new Promise((r) => setTimeout(r, 100));
    }
    o.log("bench: making a ~100 MB image of debian:12");
    const tarPath = join(dir, "layer.tar");
    const t = await run(["tar", "--numeric-owner", "-C", base.rootfs, "-cf", tarPath, "."], {
      timeoutMs: 600_000,
    });
    if (t.exitCode !== 0) throw new Error(`tar: ${t.stderr}`);
    const diffId = await fileDigest(tarPath);
    const g = await run(["gzip", "-6", "-f", tarPath], { timeoutMs: 600_000 });
    if (g.exitCode !== 0) throw new Error(`gzip: ${g.stderr}`);
    const layer = await readFile(`${tarPath}.gz`);
    const layerDigest = await push(host, layer);
    const config = Buffer.from(
      JSON.stringify({
        architecture: "amd64",
        os: "linux",
        config: { Env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"] },
        rootfs: { type: "layers", diff_ids: [diffId] },
      }),
    );
    const configDigest = await push(host, config);
    const manifest = {
      schemaVersion: 2,
      mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: {
        mediaType: "application/vnd.oci.image.config.v1+json",
        digest: configDigest,
        size: config.length,
      },
      layers: [
        { mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: layerDigest, size: layer.length },
      ],
    };
    const put = await fetch(`http://${host}/v2/bench/debian/manifests/12`, {
      method: "PUT",
      body: JSON.stringify(manifest),
      headers: { "content-type": manifest.mediaType },
    });
    if (put.status !== 201) throw new Error(`manifest push: ${put.status}`);
    const ref = `${host}/bench/debian:12`;
    const mb = (layer.length / 1e6).toFixed(0);

    const runs = o.quick ? 1 : 3;
    const floor: number[] = [];
    const floorUnpack: number[] = [];
    const pulls: number[] = [];
    // Nothing the samples write is removed until all of them are done: on this machine's
    // journal-less ext4, a tree of ~10k files deleted just before a sample makes every
    // file that sample creates cost up to 1 ms of kernel time for minutes (bench/sync.ts
    // createCostUs), which once made the pull, measured right after the floor's tree was
    // removed, look 2x slower than the floor's unpack.
    const before = createCostUs(join(dir, "probe-before"));
    let lastEnvs = "";
    for (let i = 0; i < runs; i++) {
      const out = join(dir, `skopeo-${i}`);
      let t0 = performance.now();
      const s = await run(["skopeo", "copy", "--src-tls-verify=false", `docker://${ref}`, `dir:${out}`], {
        timeoutMs: 600_000,
      });
      if (s.exitCode !== 0) throw new Error(`skopeo copy: ${s.stderr}`);
      floor.push(performance.now() - t0);
      // The same copy plus GNU tar unpacking its layer: the floor of download + unpack.
      const unpacked = join(dir, `unpacked-${i}`);
      await mkdir(unpacked);
      const layerFile = join(out, layerDigest.slice("sha256:".length));
      const x = await run(["tar", "--numeric-owner", "-C", unpacked, "-xzf", layerFile], {
        timeoutMs: 600_000,
      });
      if (x.exitCode !== 0) throw new Error(`tar -x: ${x.stderr}`);
      floorUnpack.push(performance.now() - t0);
      // A fresh cache each time: nothing of the image is there yet.
      const envs = join(dir, `envs-${i}`);
      const p = new Pyro({ home: join(dir, `pull-home-${i}`), environmentsDir: envs });
      t0 = performance.now();
      await p.pullEnvironment(ref);
      pulls.push(performance.now() - t0);
      await p.close();
      lastEnvs = envs;
    }
    const costNote = creationNote(before, createCostUs(join(dir, "probe-after")));
    const rows: BenchRow[] = [
      row(
        `env pull of a ${mb} MB image (loopback registry, unpacked)`,
        pulls,
        "skopeo copy to dir (no unpack)",
        floor,
        { max: 1.5 },
        `the floor only downloads; pyro also verifies and unpacks ~12k files safely (next row); ${costNote}`,
      ),
      row(
        `env pull of a ${mb} MB image (loopback registry, unpacked)`,
        pulls,
        "skopeo copy + GNU tar -xzf",
        floorUnpack,
        { max: 1.5 },
        costNote,
      ),
    ];

    // Workspace create: from the pulled image vs from the debootstrap environment.
    try {
      await pyro.engine.chooseBackend("bwrap", false);
    } catch (err) {
      o.log(`bench: create rows skipped: ${(err as Error).message}`);
      return rows;
    }
    const wp = new Pyro({ home: join(dir, "ws-home"), environmentsDir: lastEnvs });
    const deb = new Pyro({ home: join(dir, "ws-home-deb") });
    const createMs = async (p: Pyro, environment: string) => {
      const times: number[] = [];
      for (let i = 0; i <= (o.quick ? 3 : 10); i++) {
        const t0 = performance.now();
        const w = await p.createWorkspace({ environment, backend: "bwrap" });
        const ms = performance.now() - t0;
        await p.deleteWorkspace(w.workspace_id);
        if (i > 0) times.push(ms);
      }
      return median(times);
    };
    try {
      const fromDeb = await createMs(deb, "debian:12");
      const fromImage = await createMs(wp, ref);
      rows.push(
        row(
          "workspace create from a pulled image (bwrap)",
          fromImage,
          "create from debian:12 (debootstrap)",
          fromDeb,
          { max: 1.2 },
        ),
      );
    } finally {
      await wp.close();
      await deb.close();
    }
    return rows;
  } finally {
    registry?.kill("SIGTERM");
    await pyro.close();
    await rm(dir, { recursive: true, force: true });
  }
}

async function fileDigest(path: string): Promise<string> {
  const h = createHash("sha256");
  const { createReadStream } = await import("node:fs");
  for await (const c of createReadStream(path)) h.update(c as Buffer);
  return `sha256:${h.digest("hex")}`;
}

async function push(host: string, bytes: Buffer): Promise<string> {
  const digest = `sha256:${createHash("sha256").update(bytes).digest("hex")}`;
  const start = await fetch(`http://${host}/v2/bench/debian/blobs/uploads/`, { method: "POST" });
  const loc = new URL(start.headers.get("location") ?? "", `http://${host}`);
  loc.searchParams.set("digest", digest);
  const put = await fetch(loc, {
    method: "PUT",
    body: new Uint8Array(bytes),
    headers: { "content-type": "application/octet-stream" },
  });
  if (put.status !== 201) throw new Error(`blob push: ${put.status}`);
  return digest;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const a = s.address();
      s.close(() => resolve(typeof a === "object" && a ? a.port : 0));
    });
  });
}
