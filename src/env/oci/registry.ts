import { createHash } from "node:crypto";
import { createReadStream, createWriteStream } from "node:fs";
import { rename, stat, truncate, unlink } from "node:fs/promises";
import { PyroError } from "../../errors.js";
import { type Credentials, findCredentials, parseChallenge } from "./auth.js";
import { checkSize, MAX_CONFIG, MAX_MANIFEST, readCapped } from "./bounds.js";
import { apiHost, formatReference, type ImageReference, isLoopbackRegistry } from "./reference.js";

export const MEDIA = {
  ociIndex: "application/vnd.oci.image.index.v1+json",
  dockerList: "application/vnd.docker.distribution.manifest.list.v2+json",
  ociManifest: "application/vnd.oci.image.manifest.v1+json",
  dockerManifest: "application/vnd.docker.distribution.manifest.v2+json",
} as const;
const ACCEPT = [MEDIA.ociIndex, MEDIA.dockerList, MEDIA.ociManifest, MEDIA.dockerManifest].join(", ");
/** A stalled transfer (no byte for this long) is dropped and resumed. */
const IDLE_MS = 60_000;
const REQUEST_MS = 60_000;
const RESUME_ATTEMPTS = 6;

export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
  platform?: { os?: string; architecture?: string; variant?: string };
}

export interface ImageManifest {
  mediaType?: string;
  schemaVersion: number;
  config: Descriptor;
  layers: Descriptor[];
}

export interface ImageConfig {
  architecture?: string;
  os?: string;
  config?: { Env?: string[]; WorkingDir?: string; User?: string; Entrypoint?: string[]; Cmd?: string[] };
  rootfs?: { diff_ids?: string[] };
}

export interface ResolvedImage {
  /** The digest of the manifest the layers come from (platform manifest for an index). */
  digest: string;
  /** The digest the reference resolved to (the index's, when it was a multi-arch image). */
  index_digest: string | null;
  manifest: ImageManifest;
  config: ImageConfig;
}

export interface RegistryOptions {
  /** For DOCKER_CONFIG and HOME (the Docker client's config.json). */
  env: NodeJS.ProcessEnv;
  /** PYRO_REGISTRY_AUTH, read by core/config.ts. */
  registryAuth?: string | undefined;
  /** Plain HTTP (loopback registries only). */
  insecure?: boolean;
  signal?: AbortSignal;
}

/**
 * A client for the OCI distribution API (what Docker Hub, GHCR, and the CNCF
 * `distribution` server speak): manifests, blobs, the `WWW-Authenticate` token flow.
 * Written on Node's fetch: pulls need resumable, verified, progress-reporting blob
 * downloads into pyro's own content-addressed store, which no CLI tool gives as a
 * library (docs/environments.md says why not skopeo).
 */
export class RegistryClient {
  private scheme: "https" | "http";
  private token: string | null = null;
  private basic: string | null = null;
  private credentials: Credentials | null | undefined;

  constructor(
    readonly ref: ImageReference,
    private readonly options: RegistryOptions,
  ) {
    if (options.insecure && !isLoopbackRegistry(ref.registry)) {
      throw new PyroError(
        "invalid_argument",
        `--insecure-registry is only for registries on this machine, not ${ref.registry}`,
        "use a loopback address (127.0.0.1, localhost, ::1) or drop the flag",
      );
    }
    this.scheme = options.insecure ? "http" : "https";
  }

  private url(path: string): string {
    return `${this.scheme}://${apiHost(this.ref.registry)}/v2/${this.ref.repository}/${path}`;
  }

  /**
   * One request with the registry's auth dance: on 401, read the challenge, get a
   * token (Bearer) or use Basic credentials, and try once more. A loopback registry
   * that does not speak TLS is retried over plain HTTP, as Docker does.
   */
  async request(
    path: string,
    init: { headers?: Record<string, string>; method?: string } = {},
  ): Promise<Response> {
    for (let attempt = 0; attempt < 3; attempt++) {
      const headers: Record<string, string> = { ...init.headers };
      if (this.token) headers.authorization = `Bearer ${this.token}`;
      else if (this.basic) headers.authorization = `Basic ${this.basic}`;
      let res: Response;
      try {
        res = await fetch(this.url(path), {
          method: init.method ?? "GET",
          headers,
          signal: this.signal(REQUEST_MS),
          redirect: "follow",
        });
      } catch (err) {
        if (this.options.signal?.aborted) throw new PyroError("cancelled", "the pull was cancelled");
        if (this.scheme === "https" && isLoopbackRegistry(this.ref.registry)) {
          this.scheme = "http";
          continue;
        }
        throw new RegistryUnreachable(
          `cannot reach registry ${this.ref.registry}: ${errText(err)}`,
          "check the reference and the network; registries on this machine may need --insecure-registry",
        );
      }
      if (res.status !== 401 || attempt === 2) return res;
      const challenge = parseChallenge(res.headers.get("www-authenticate") ?? "");
      await res.body?.cancel();
      if (!challenge) return res;
      if (challenge.scheme === "bearer") await this.fetchToken(challenge.params);
      else if (challenge.scheme === "basic") {
        const c = await this.creds();
        if (!c || this.basic) return deny(this.ref, c !== null);
        this.basic = Buffer.from(`${c.username}:${c.password}`).toString("base64");
      } else return res;
    }
    throw new Error("unreachable");
  }

  private async creds(): Promise<Credentials | null> {
    if (this.credentials === undefined)
      this.credentials = await findCredentials(
        this.ref.registry,
        this.options.env,
        this.options.registryAuth,
      );
    return this.credentials;
  }

  private async fetchToken(params: Record<string, string>): Promise<void> {
    const realm = params.realm;
    if (!realm)
      throw new PyroError(
        "build_failed",
        `registry ${this.ref.registry} sent a Bearer challenge without a realm`,
      );
    const url = new URL(realm);
    if (url.protocol !== "https:" && !(url.protocol === "http:" && isLoopbackRegistry(url.host))) {
      throw new PyroError(
        "build_failed",
        `registry ${this.ref.registry} names a token service over plain HTTP: ${url.host}`,
      );
    }
    if (params.service) url.searchParams.set("service", params.service);
    url.searchParams.set("scope", params.scope ?? `repository:${this.ref.repository}:pull`);
    const c = await this.creds();
    const headers: Record<string, string> = {};
    if (c) headers.authorization = `Basic ${Buffer.from(`${c.username}:${c.password}`).toString("base64")}`;
    let res: Response;
    try {
      res = await fetch(url, { headers, signal: this.signal(REQUEST_MS) });
    } catch (err) {
      throw new RegistryUnreachable(
        `cannot reach the token service of ${this.ref.registry}: ${errText(err)}`,
        "check the network",
      );
    }
    if (res.status === 401 || res.status === 403) {
      await res.body?.cancel();
      return deny(this.ref, c !== null);
    }
    if (!res.ok) {
      await res.body?.cancel();
      throw new PyroError("build_failed", `the token service of ${this.ref.registry} answered ${res.status}`);
    }
    const body = (await res.json()) as { token?: string; access_token?: string };
    const token = body.token ?? body.access_token;
    if (!token)
      throw new PyroError("build_failed", `the token service of ${this.ref.registry} sent no token`);
    this.token = token;
  }

  private signal(ms: number): AbortSignal {
    const t = AbortSignal.timeout(ms);
    return this.options.signal ? AbortSignal.any([t, this.options.signal]) : t;
  }

  /** Fetches a manifest by tag or digest; verifies a digest reference against the bytes. */
  async manifest(
    tagOrDigest: string,
  ): Promise<{ digest: string; mediaType: string; json: Record<string, unknown> }> {
    const res = await this.request(`manifests/${tagOrDigest}`, { headers: { accept: ACCEPT } });
    if (res.status === 404) {
      await res.body?.cancel();
      throw new PyroError(
        "environment_not_found",
        `no image ${formatReference({ ...this.ref, tag: tagOrDigest.startsWith("sha256:") ? null : tagOrDigest, digest: tagOrDigest.startsWith("sha256:") ? tagOrDigest : null })}`,
        "check the repository, the tag and the registry",
      );
    }
    if (!res.ok) {
      await res.body?.cancel();
      throw new PyroError(
        "build_failed",
        `registry ${this.ref.registry} answered ${res.status} for the manifest`,
      );
    }
    const bytes = await readCapped(res, MAX_MANIFEST, "the manifest");
    const digest = `sha256:${createHash("sha256").update(bytes).digest("hex")}`;
    if (tagOrDigest.startsWith("sha256:") && digest !== tagOrDigest) {
      throw new PyroError("build_failed", `the manifest's content does not match its digest ${tagOrDigest}`);
    }
    let json: Record<string, unknown>;
    try {
      json = JSON.parse(bytes.toString("utf8"));
    } catch {
      throw new PyroError("build_failed", "the registry sent a manifest that is not JSON");
    }
    const mediaType = String(json.mediaType ?? res.headers.get("content-type")?.split(";")[0] ?? "");
    return { digest, mediaType, json };
  }

  /**
   * The digest the reference's tag names now: a HEAD of the manifest (its
   * Docker-Content-Digest), else a GET hashed here. The digest is only a name to pull by:
   * what is pulled under it is verified against it. A registry that answers 5xx is
   * unreachable as much as one that does not answer.
   */
  async tagDigest(): Promise<string> {
    const tag = this.ref.tag ?? "latest";
    const res = await this.request(`manifests/${tag}`, { method: "HEAD", headers: { accept: ACCEPT } });
    await res.body?.cancel();
    if (res.status >= 500 || res.status === 429)
      throw new RegistryUnreachable(
        `registry ${this.ref.registry} answered ${res.status}`,
        "try again later",
      );
    const header = res.headers.get("docker-content-digest") ?? "";
    if (res.ok && /^sha256:[a-f0-9]{64}$/.test(header)) return header;
    return (await this.manifest(tag)).digest;
  }

  /** Resolves the reference to one linux/amd64 image manifest and its config. */
  async resolve(): Promise<ResolvedImage> {
    let m = await this.manifest(this.ref.digest ?? this.ref.tag ?? "latest");
    let indexDigest: string | null = null;
    if (
      m.mediaType === MEDIA.ociIndex ||
      m.mediaType === MEDIA.dockerList ||
      Array.isArray(m.json.manifests)
    ) {
      indexDigest = m.digest;
      const list = (m.json.manifests ?? []) as Descriptor[];
      const pick =
        list.find(
          (d) =>
            d.platform?.os === "linux" &&
            d.platform.architecture === "amd64" &&
            (d.platform.variant ?? "") === "",
        ) ?? list.find((d) => d.platform?.os === "linux" && d.platform.architecture === "amd64");
      if (!pick) {
        const have = list.map((d) => `${d.platform?.os}/${d.platform?.architecture}`).join(", ");
        throw new PyroError(
          "unsupported",
          `${formatReference(this.ref)} has no linux/amd64 image (it has ${have || "none"})`,
          "pick an image built for linux/amd64",
        );
      }
      m = await this.manifest(pick.digest);
    }
    if (
      m.mediaType !== MEDIA.ociManifest &&
      m.mediaType !== MEDIA.dockerManifest &&
      !Array.isArray(m.json.layers)
    ) {
      throw new PyroError(
        "unsupported",
        `unsupported manifest type '${m.mediaType}' for ${formatReference(this.ref)}`,
        "pyro reads OCI and Docker v2 schema 2 images",
      );
    }
    const manifest = m.json as unknown as ImageManifest;
    if (!manifest.config?.digest || !Array.isArray(manifest.layers)) {
      throw new PyroError("build_failed", "the image manifest has no config or no layers");
    }
    for (const d of [manifest.config, ...manifest.layers]) checkDigest(d.digest);
    for (const d of manifest.layers) checkSize(d);
    const res = await this.request(`blobs/${manifest.config.digest}`);
    if (!res.ok) {
      await res.body?.cancel();
      throw new PyroError(
        "build_failed",
        `registry ${this.ref.registry} answered ${res.status} for the image config`,
      );
    }
    const bytes = await readCapped(res, MAX_CONFIG, "the image config");
    if (`sha256:${createHash("sha256").update(bytes).digest("hex")}` !== manifest.config.digest) {
      throw new PyroError(
        "build_failed",
        `the image config does not match its digest ${manifest.config.digest}`,
      );
    }
    const config = JSON.parse(bytes.toString("utf8")) as ImageConfig;
    if (config.os && config.os !== "linux")
      throw new PyroError("unsupported", `the image is for ${config.os}, not linux`);
    return { digest: m.digest, index_digest: indexDigest, manifest, config };
  }

  /**
   * Downloads a blob into `partial`, resuming from what is already there (a `Range`
   * request, after a dropped connection or in a later pull), verifies its sha256 and
   * size, then renames it to `dest`. A mismatch removes the partial file and refuses.
   */
  async download(d: Descriptor, partial: string, dest: string, onBytes: (n: number) => void): Promise<void> {
    const expected = checkDigest(d.digest);
    checkSize(d);
    let reported = 0;
    let failures = 0;
    let streamHash: StreamHash | null = null;
    let lastError: unknown = null;
    for (;;) {
      const have = await fileSize(partial);
      if (have > reported) {
        onBytes(have - reported);
        reported = have;
      }
      if (have >= d.size) break;
      if (failures >= RESUME_ATTEMPTS) {
        throw new PyroError(
          "build_failed",
          `download of layer ${d.digest.slice(7, 19)} kept failing: ${errText(lastError)}`,
          "run the pull again: it resumes where it stopped",
        );
      }
      let res: Response;
      try {
        res = await this.request(`blobs/${d.digest}`, {
          headers: have > 0 ? { range: `bytes=${have}-` } : {},
        });
      } catch (err) {
        if (!(err instanceof PyroError) || err.code !== "build_failed") throw err;
        lastError = err;
        failures++;
        continue;
      }
      if (res.status === 416 && have > 0) {
        await res.body?.cancel();
        break;
      }
      if (!res.ok || !res.body) {
        await res.body?.cancel();
        if (res.status >= 500 || res.status === 429) {
          lastError = new Error(`HTTP ${res.status}`);
          failures++;
          continue;
        }
        throw new PyroError(
          "build_failed",
          `registry ${this.ref.registry} answered ${res.status} for layer ${d.digest}`,
        );
      }
      if (have > 0 && res.status !== 206) {
        // The server ignored the range: start over from byte 0.
        await truncate(partial, 0);
      }
      // A download from byte 0 in one piece is hashed as it arrives (no second read).
      streamHash = (await fileSize(partial)) === 0 ? { hash: createHash("sha256"), bytes: 0 } : null;
      try {
        await this.appendBody(
          res,
          partial,
          d.size - (await fileSize(partial)),
          (n) => {
            reported += n;
            onBytes(n);
          },
          streamHash,
        );
      } catch (err) {
        if (this.options.signal?.aborted) throw new PyroError("cancelled", "the pull was cancelled");
        if (err instanceof PyroError) {
          await unlink(partial).catch(() => {});
          throw err;
        }
        lastError = err;
        streamHash = null;
        // A connection that moved the download forward is worth retrying at once.
        failures = (await fileSize(partial)) > have ? 0 : failures + 1;
      }
    }
    const size = await fileSize(partial);
    let digest: string;
    if (streamHash && streamHash.bytes === size) digest = streamHash.hash.digest("hex");
    else {
      // Resumed (or restarted): hash what is on disk.
      const hash = createHash("sha256");
      for await (const chunk of createReadStream(partial)) hash.update(chunk as Buffer);
      digest = hash.digest("hex");
    }
    if (digest !== expected || size !== d.size) {
      await unlink(partial).catch(() => {});
      throw new PyroError(
        "build_failed",
        `layer ${d.digest} failed verification: got sha256:${digest} (${size} bytes, expected ${d.size})`,
        "the registry served corrupt or tampered content; nothing was kept",
      );
    }
    await rename(partial, dest);
  }

  /**
   * Appends the body to `partial`, feeding `sh` (a hash kept when the file started
   * empty). At most `limit` bytes (what the descriptor's size leaves): a longer body is
   * refused, never written past the size.
   */
  private async appendBody(
    res: Response,
    partial: string,
    limit: number,
    onBytes: (n: number) => void,
    sh: StreamHash | null,
  ): Promise<number> {
    const out = createWriteStream(partial, { flags: "a" });
    let writeError: Error | null = null;
    out.on("error", (err) => {
      writeError = err;
      out.emit("drain");
    });
    let written = 0;
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    let idle: NodeJS.Timeout | undefined;
    const armIdle = () => {
      clearTimeout(idle);
      idle = setTimeout(() => reader.cancel(new Error("stalled")).catch(() => {}), IDLE_MS);
    };
    try {
      armIdle();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        armIdle();
        const buf = Buffer.from(value.buffer, value.byteOffset, value.byteLength);
        if (written + buf.length > limit) {
          await reader.cancel().catch(() => {});
          throw new PyroError(
            "build_failed",
            `the registry sent more bytes for a layer than its manifest's size`,
            "the registry served corrupt or tampered content; nothing was kept",
          );
        }
        if (!out.write(buf)) await new Promise<void>((r) => out.once("drain", () => r()));
        if (writeError) throw writeError;
        if (sh) {
          sh.hash.update(buf);
          sh.bytes += buf.length;
        }
        written += buf.length;
        onBytes(buf.length);
      }
    } finally {
      clearTimeout(idle);
      await new Promise<void>((resolve, reject) =>
        out.end((err?: Error | null) => (err ? reject(err) : resolve())),
      );
    }
    return written;
  }
}

/** The registry did not answer (network, DNS, refused, 5xx): a tag cannot be re-resolved. */
export class RegistryUnreachable extends PyroError {
  constructor(message: string, hint: string) {
    super("build_failed", message, hint);
  }
}

interface StreamHash {
  hash: ReturnType<typeof createHash>;
  bytes: number;
}

async function fileSize(path: string): Promise<number> {
  return stat(path).then(
    (s) => s.size,
    () => 0,
  );
}

function checkDigest(digest: string): string {
  const m = /^sha256:([a-f0-9]{64})$/.exec(digest);
  if (!m?.[1])
    throw new PyroError(
      "unsupported",
      `unsupported or malformed digest '${digest}'`,
      "pyro verifies sha256 digests only",
    );
  return m[1];
}

function deny(ref: ImageReference, hadCredentials: boolean): never {
  throw new PyroError(
    "permission_denied",
    `registry ${ref.registry} refused access to ${ref.repository}${hadCredentials ? " with the configured credentials" : ""}`,
    hadCredentials
      ? "check the credentials in PYRO_REGISTRY_AUTH or $DOCKER_CONFIG/config.json"
      : "set PYRO_REGISTRY_AUTH=HOST=USER:PASSWORD or log in with docker login (config.json)",
  );
}

function errText(err: unknown): string {
  if (err instanceof Error) {
    const cause = (err as Error & { cause?: unknown }).cause;
    return cause instanceof Error ? `${err.message} (${cause.message})` : err.message;
  }
  return String(err);
}
