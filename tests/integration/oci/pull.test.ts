/**
 * Pulls from a real registry (Debian's docker-registry on loopback), with images the test
 * builds itself: a busybox base made with umoci and pushed with skopeo, then layers that
 * delete (whiteout), empty a directory (opaque), hard-link, symlink, and write through a
 * lower layer's symlinks; gzip and zstd; an index; token auth; a dropped connection; a
 * corrupted blob; hostile names.
 */
import { execFileSync } from "node:child_process";
import { existsSync, lstatSync, readFileSync, readlinkSync, statSync } from "node:fs";
import { link, mkdir, mkdtemp, readdir, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EnvironmentCache } from "../../../src/env/cache.js";
import { OciBuilder } from "../../../src/env/oci/builder.js";
import { PyroError } from "../../../src/errors.js";
import {
  getBlob,
  getManifest,
  pushBlob,
  putManifest,
  type Registry,
  rawTar,
  registrySkipReason,
  sha256,
  startFront,
  startRegistry,
  tarDir,
} from "../../helpers/registry.js";

const skip = await registrySkipReason();
const OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX = "application/vnd.oci.image.index.v1+json";
const GZIP_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip";
const ZSTD_LAYER = "application/vnd.oci.image.layer.v1.tar+zstd";

describe.skipIf(skip !== null)(`OCI pull from a real registry${skip ? ` (skipped: ${skip})` : ""}`, () => {
  let registry: Registry;
  let work: string;
  let fullDigest: string;
  let layer3: string;
  let baseLayer: string;

  /** A cache of its own per test, so nothing leaks between cases. */
  async function cache(env: NodeJS.ProcessEnv = {}) {
    const root = await mkdtemp(join(work, "envs-"));
    return {
      root,
      cache: new EnvironmentCache(root, [
        new OciBuilder({ storeDir: join(root, ".oci"), env, registryAuth: env.PYRO_REGISTRY_AUTH }),
      ]),
    };
  }

  /** Pushes `layers` on top of `base`'s and tags the result. */
  async function compose(
    tag: string,
    extra: { bytes: Buffer; media: string; diffId: string }[],
    options: { arch?: string; base?: string } = {},
  ): Promise<string> {
    const base = await getManifest(registry.host, "t/img", options.base ?? "base");
    const config = JSON.parse((await getBlob(registry.host, "t/img", base.json.config.digest)).toString());
    config.rootfs.diff_ids.push(...extra.map((e) => e.diffId));
    if (options.arch) config.architecture = options.arch;
    const configBytes = Buffer.from(JSON.stringify(config));
    const configDigest = await pushBlob(registry.host, "t/img", configBytes);
    const layers = [...base.json.layers];
    for (const e of extra) {
      layers.push({
        mediaType: e.media,
        digest: await pushBlob(registry.host, "t/img", e.bytes),
        size: e.bytes.length,
      });
    }
    return putManifest(
      registry.host,
      "t/img",
      tag,
      {
        schemaVersion: 2,
        mediaType: OCI_MANIFEST,
        config: {
          mediaType: "application/vnd.oci.image.config.v1+json",
          digest: configDigest,
          size: configBytes.length,
        },
        layers,
      },
      OCI_MANIFEST,
    );
  }

  beforeAll(async () => {
    registry = await startRegistry();
    work = await mkdtemp(join(tmpdir(), "pyro-oci-test-"));
    // Base (umoci, pushed by skopeo): busybox, files to keep, delete and hide.
    const run = (cmd: string, ...args: string[]) => execFileSync(cmd, args, { cwd: work, stdio: "pipe" });
    run("umoci", "init", "--layout", "L");
    run("umoci", "new", "--image", "L:base");
    run("umoci", "unpack", "--rootless", "--image", "L:base", "b");
    const r = join(work, "b", "rootfs");
    await mkdir(join(r, "bin"), { recursive: true });
    await writeFile(join(r, "bin", "busybox"), readFileSync("/bin/busybox"), { mode: 0o755 });
    await symlink("busybox", join(r, "bin", "sh"));
    await mkdir(join(r, "etc"));
    await writeFile(join(r, "etc", "keep.txt"), "kept\n");
    await writeFile(join(r, "etc", "gone.txt"), "deleted by the next layer\n");
    await mkdir(join(r, "opt", "old"), { recursive: true });
    await writeFile(join(r, "opt", "old", "a.txt"), "hidden by an opaque dir\n");
    run("umoci", "repack", "--image", "L:base", "b");
    // Second layer by umoci: a deletion becomes a whiteout.
    await rm(join(r, "etc", "gone.txt"));
    await writeFile(join(r, "etc", "added.txt"), "added\n");
    run("umoci", "repack", "--image", "L:base", "b");
    // After the last repack: repack rebuilds on the config the bundle was unpacked from.
    run(
      "umoci",
      "config",
      "--image",
      "L:base",
      "--config.env",
      "GREETING=hello",
      "--config.workingdir",
      "/srv",
    );
    run("skopeo", "copy", "--dest-tls-verify=false", "oci:L:base", `docker://${registry.host}/t/img:base`);
    baseLayer = String(
      (await getManifest(registry.host, "t/img", "base")).json.layers[0] &&
        ((await getManifest(registry.host, "t/img", "base")).json.layers[0] as { digest: string }).digest,
    );

    // Third layer (node-tar from a directory): opaque dir, hard link, symlinks.
    const l3 = join(work, "l3");
    await mkdir(join(l3, "opt", "old"), { recursive: true });
    await writeFile(join(l3, "opt", "old", ".wh..wh..opq"), "");
    await writeFile(join(l3, "opt", "old", "new.txt"), "only this\n");
    await mkdir(join(l3, "data"));
    await writeFile(join(l3, "data", "file.txt"), "linked\n");
    await link(join(l3, "data", "file.txt"), join(l3, "data", "hard.txt"));
    await symlink("file.txt", join(l3, "data", "soft"));
    await mkdir(join(l3, "usr", "lib"), { recursive: true });
    await symlink("usr/lib", join(l3, "lib"));
    await symlink("/", join(l3, "escape"));
    const t3 = await tarDir(l3);
    // Fourth layer: writes through lower symlinks, which resolve inside the root.
    const t4 = rawTar([
      { path: "lib/x.txt", body: "through /lib\n" },
      { path: "escape/tmp/pyro-oci-escape-probe", body: "must stay inside\n" },
    ]);
    const g3 = gzipSync(t3);
    layer3 = sha256(g3);
    fullDigest = await compose("full", [
      { bytes: g3, media: GZIP_LAYER, diffId: sha256(t3) },
      { bytes: gzipSync(t4), media: GZIP_LAYER, diffId: sha256(t4) },
    ]);
    // The same third layer as zstd.
    const z3 = execFileSync("zstd", ["-q", "-c"], { input: t3 });
    await compose("zstd", [{ bytes: z3, media: ZSTD_LAYER, diffId: sha256(t3) }]);
    // An index: arm64 first, amd64 second.
    const arm = await compose("arm64", [], { arch: "arm64" });
    const amd = await compose("amd64", [{ bytes: g3, media: GZIP_LAYER, diffId: sha256(t3) }]);
    const size = async (tag: string) =>
      (
        await fetch(`http://${registry.host}/v2/t/img/manifests/${tag}`, {
          headers: { accept: OCI_MANIFEST },
        })
      ).headers.get("content-length");
    await putManifest(
      registry.host,
      "t/img",
      "multi",
      {
        schemaVersion: 2,
        mediaType: OCI_INDEX,
        manifests: [
          {
            mediaType: OCI_MANIFEST,
            digest: arm,
            size: Number(await size("arm64")),
            platform: { os: "linux", architecture: "arm64" },
          },
          {
            mediaType: OCI_MANIFEST,
            digest: amd,
            size: Number(await size("amd64")),
            platform: { os: "linux", architecture: "amd64" },
          },
        ],
      },
      OCI_INDEX,
    );
    // Hostile layers.
    const hostile = (entries: Parameters<typeof rawTar>[0]) => {
      const t = rawTar(entries);
      return [{ bytes: gzipSync(t), media: GZIP_LAYER, diffId: sha256(t) }];
    };
    await compose("dotdot", hostile([{ path: "../pyro-oci-dotdot", body: "x" }]));
    await compose("absolute", hostile([{ path: "/tmp/pyro-oci-absolute", body: "x" }]));
    await compose(
      "hardlink-out",
      hostile([{ path: "pw", type: "Link", linkpath: "../../../../etc/passwd" }]),
    );
  }, 120_000);

  afterAll(async () => {
    await registry?.stop();
    if (work) await rm(work, { recursive: true, force: true });
  });

  it("pulls by tag: layers applied in order with whiteouts, an opaque dir, a hard link and symlinks resolved inside the root", async () => {
    const { cache: c } = await cache();
    const r = await c.pull(`${registry.host}/t/img:full`);
    expect(r.built).toBe(true);
    expect(r.digest).toBe(fullDigest);
    expect(r.image_env).toMatchObject({ GREETING: "hello" });
    const root = r.rootfs;
    expect(readFileSync(join(root, "etc/keep.txt"), "utf8")).toBe("kept\n");
    expect(readFileSync(join(root, "etc/added.txt"), "utf8")).toBe("added\n");
    expect(existsSync(join(root, "etc/gone.txt"))).toBe(false);
    expect(existsSync(join(root, "etc/.wh.gone.txt"))).toBe(false);
    expect((await readdir(join(root, "opt/old"))).sort()).toEqual(["new.txt"]);
    expect(statSync(join(root, "data/hard.txt")).ino).toBe(statSync(join(root, "data/file.txt")).ino);
    expect(readlinkSync(join(root, "data/soft"))).toBe("file.txt");
    expect(lstatSync(join(root, "bin/sh")).isSymbolicLink()).toBe(true);
    expect(statSync(join(root, "bin/busybox")).mode & 0o777).toBe(0o755);
    expect(readFileSync(join(root, "usr/lib/x.txt"), "utf8")).toBe("through /lib\n");
    // `escape -> /` resolved inside the root: the write landed in the image's /tmp.
    expect(readFileSync(join(root, "tmp/pyro-oci-escape-probe"), "utf8")).toBe("must stay inside\n");
    expect(existsSync("/tmp/pyro-oci-escape-probe")).toBe(false);
    const info = await c.info(`${registry.host}/t/img:full`);
    expect(info).toMatchObject({ kind: "pulled", status: "cached", digest: fullDigest });
    expect((await c.list()).map((e) => e.name)).toContain(`${registry.host}/t/img:full`);
    // A second pull is a cache hit.
    expect((await c.pull(`${registry.host}/t/img:full`)).built).toBe(false);
  });

  it("pulls by digest, and a second image sharing layers downloads only what it lacks", async () => {
    const { cache: c, root } = await cache();
    const front = await startFront(registry.host);
    try {
      const byDigest = await c.pull(`${front.host}/t/img@${fullDigest}`);
      expect(byDigest.digest).toBe(fullDigest);
      expect(readFileSync(join(byDigest.rootfs, "opt/old/new.txt"), "utf8")).toBe("only this\n");
      front.requests.length = 0;
      const other = await c.pull(`${front.host}/t/img:amd64`);
      expect(readFileSync(join(other.rootfs, "data/file.txt"), "utf8")).toBe("linked\n");
      const blobGets = front.requests.filter((q) => q.method === "GET" && q.path.includes("/blobs/sha256:"));
      // Only the new config blob: every layer of amd64 was already in the store.
      expect(blobGets.length).toBe(1);
      const blobs = await readdir(join(root, ".oci/blobs/sha256"));
      expect(blobs).toContain(layer3.slice(7));
    } finally {
      await front.stop();
    }
  });

  it("resolves a multi-arch index to linux/amd64", async () => {
    const { cache: c } = await cache();
    const r = await c.pull(`${registry.host}/t/img:multi`);
    expect(readFileSync(join(r.rootfs, "data/file.txt"), "utf8")).toBe("linked\n");
    const m = await c.readManifest(r.path);
    expect(m?.source_detail).toMatchObject({ platform: "linux/amd64" });
    expect(m?.source_detail.index_digest).toMatch(/^sha256:/);
  });

  it("applies a zstd layer", async () => {
    const { cache: c } = await cache();
    const r = await c.pull(`${registry.host}/t/img:zstd`);
    expect((await readdir(join(r.rootfs, "opt/old"))).sort()).toEqual(["new.txt"]);
    expect(statSync(join(r.rootfs, "data/hard.txt")).ino).toBe(statSync(join(r.rootfs, "data/file.txt")).ino);
  });

  it("gets a token from the registry's WWW-Authenticate realm with PYRO_REGISTRY_AUTH, and is refused without it", async () => {
    const front = await startFront(registry.host, { credentials: { username: "ann", password: "s3cret" } });
    try {
      const denied = await cache();
      const err = await denied.cache.pull(`${front.host}/t/img:base`).catch((e) => e);
      expect(err).toBeInstanceOf(PyroError);
      expect((err as PyroError).code).toBe("permission_denied");
      expect((await denied.cache.list()).filter((e) => e.kind === "pulled")).toEqual([]);
      const ok = await cache({ PYRO_REGISTRY_AUTH: `${front.host}=ann:s3cret` });
      const r = await ok.cache.pull(`${front.host}/t/img:base`);
      expect(readFileSync(join(r.rootfs, "etc/keep.txt"), "utf8")).toBe("kept\n");
      expect(front.requests.some((q) => q.auth?.startsWith("Bearer "))).toBe(true);
      // Docker's config.json works the same way.
      const dockerDir = await mkdtemp(join(work, "docker-"));
      await writeFile(
        join(dockerDir, "config.json"),
        JSON.stringify({ auths: { [front.host]: { auth: Buffer.from("ann:s3cret").toString("base64") } } }),
      );
      const viaConfig = await cache({ DOCKER_CONFIG: dockerDir });
      expect((await viaConfig.cache.pull(`${front.host}/t/img:base`)).built).toBe(true);
    } finally {
      await front.stop();
    }
  });

  it("resumes a layer whose connection dropped midway with a Range request", async () => {
    const front = await startFront(registry.host, { drop: { digest: baseLayer, afterBytes: 200_000 } });
    try {
      const { cache: c } = await cache();
      const r = await c.pull(`${front.host}/t/img:base`);
      expect(statSync(join(r.rootfs, "bin/busybox")).size).toBe(statSync("/bin/busybox").size);
      const gets = front.requests.filter((q) => q.path.endsWith(baseLayer));
      expect(gets.length).toBe(2);
      // The second request asks only for what the first did not deliver.
      const from = Number(/^bytes=(\d+)-$/.exec(gets[1]?.range ?? "")?.[1]);
      expect(from).toBeGreaterThan(0);
      expect(from).toBeLessThanOrEqual(200_000);
    } finally {
      await front.stop();
    }
  });

  it("refuses a layer whose content does not match its digest and keeps nothing", async () => {
    const front = await startFront(registry.host, { corrupt: layer3 });
    try {
      const { cache: c, root } = await cache();
      const err = await c.pull(`${front.host}/t/img:full`).catch((e) => e);
      expect(err).toBeInstanceOf(PyroError);
      expect((err as PyroError).code).toBe("build_failed");
      expect((err as PyroError).message).toContain("failed verification");
      expect((await c.list()).filter((e) => e.kind === "pulled")).toEqual([]);
      expect(await readdir(join(root, ".oci/blobs/sha256"))).not.toContain(layer3.slice(7));
      expect(await readdir(join(root, ".oci/partial"))).toEqual([]);
      expect((await readdir(root)).filter((d) => !d.startsWith("."))).toEqual([]);
    } finally {
      await front.stop();
    }
  });

  it.each([
    ["dotdot", "climbs out"],
    ["absolute", "absolute entry name"],
    ["hardlink-out", "climbs out"],
  ])("refuses a layer with a hostile name (%s) and keeps no environment", async (tag, why) => {
    const { cache: c, root } = await cache();
    const err = await c.pull(`${registry.host}/t/img:${tag}`).catch((e) => e);
    expect(err).toBeInstanceOf(PyroError);
    expect((err as PyroError).message).toContain(why);
    expect((await readdir(root)).filter((d) => !d.startsWith("."))).toEqual([]);
    expect(existsSync(join(root, "pyro-oci-dotdot"))).toBe(false);
    expect(existsSync("/tmp/pyro-oci-absolute")).toBe(false);
  });

  it("refuses --insecure-registry for a registry that is not on loopback, and an unknown tag", async () => {
    const { cache: c } = await cache();
    const err = await c.pull("registry.example/x/y:1", { insecureRegistry: true }).catch((e) => e);
    expect((err as PyroError).code).toBe("invalid_argument");
    const missing = await c.pull(`${registry.host}/t/img:nope`).catch((e) => e);
    expect((missing as PyroError).code).toBe("environment_not_found");
  });
});
