import { mkdir, mkdtemp, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { cloneRepo, gitToplevel } from "../core/git.js";
import { PyroError } from "../errors.js";

/** Where a workspace's files come from when `workspace_create` omits `seed_path`. */
export interface DefaultSeedInfo {
  origin: "cwd" | "project_path" | "repo_url";
  /** The directory seeded from (a Git checkout: its tracked files are copied). */
  path: string;
  repo_url?: string;
  repo_ref?: string;
  commit?: string;
}

/**
 * The server's default seed. `resolve()` is called per create; a clone is made once per
 * server (on first use, started in the background at startup) and reused, so every
 * workspace of one server starts from the same commit.
 */
export interface DefaultSeed {
  /** One line for logs and docs: what the default is. */
  describe(): string;
  /** The local directory it seeds from, if there is one before any call (for host-path confinement). */
  root(): string | null;
  resolve(signal?: AbortSignal): Promise<DefaultSeedInfo | null>;
  close(): Promise<void>;
}

export interface SeedFlags {
  projectPath?: string | undefined;
  repoUrl?: string | undefined;
  repoRef?: string | undefined;
  /** The directory the server was started in. */
  cwd: string;
  /**
   * Where a --repo-url clone is kept ($PYRO_HOME/repos): workspaces seeded from it commit
   * their branches there, so it outlives the server once a workspace used it. Without it,
   * a private temp directory removed at close.
   */
  reposDir?: string | undefined;
}

/**
 * Chooses the default seed from the server's flags, in this order:
 * `--repo-url` (a clean clone), `--project-path` (that directory; the top of its Git
 * checkout when it is inside one), else the Git checkout containing `cwd`. A `cwd` that
 * is not inside a Git checkout gives no default (an empty workspace): copying an
 * arbitrary directory, a home directory say, would be a surprise.
 */
export async function defaultSeed(flags: SeedFlags): Promise<DefaultSeed> {
  if (flags.repoRef !== undefined && flags.repoUrl === undefined) {
    throw new PyroError("invalid_argument", "--repo-ref needs --repo-url");
  }
  if (flags.repoUrl !== undefined) {
    if (flags.projectPath !== undefined)
      throw new PyroError("invalid_argument", "pass either --project-path or --repo-url, not both");
    return new RepoSeed(flags.repoUrl, flags.repoRef, flags.reposDir);
  }
  if (flags.projectPath !== undefined) {
    const dir = resolve(flags.cwd, flags.projectPath);
    const st = await stat(dir).catch(() => null);
    if (!st?.isDirectory())
      throw new PyroError("invalid_argument", `--project-path ${dir} is not a directory`);
    return new LocalSeed({ origin: "project_path", path: (await gitToplevel(dir)) ?? dir });
  }
  const top = await gitToplevel(resolve(flags.cwd));
  return top ? new LocalSeed({ origin: "cwd", path: top }) : NO_SEED;
}

export const NO_SEED: DefaultSeed = {
  describe: () => "none (workspaces start empty unless seed_path is given)",
  root: () => null,
  resolve: async () => null,
  close: async () => {},
};

/** A fixed directory: the test-supplied one, --project-path, or the cwd's checkout. */
export class LocalSeed implements DefaultSeed {
  constructor(private readonly info: DefaultSeedInfo) {}
  describe(): string {
    return `${this.info.path} (${this.info.origin === "cwd" ? "the Git checkout the server started in" : "--project-path"})`;
  }
  root(): string {
    return this.info.path;
  }
  async resolve(): Promise<DefaultSeedInfo> {
    return this.info;
  }
  async close(): Promise<void> {}
}

/**
 * A clean clone of --repo-url (at --repo-ref), made once per server under `reposDir` (or
 * a private temp directory). Removed at close unless a workspace was seeded from it
 * (that workspace's `workspace_commit` writes its branch into this clone).
 */
class RepoSeed implements DefaultSeed {
  private clone: Promise<DefaultSeedInfo> | undefined;
  private tmp: string | undefined;
  private closed = false;
  private used = false;

  constructor(
    private readonly url: string,
    private readonly ref: string | undefined,
    private readonly reposDir?: string | undefined,
  ) {}

  describe(): string {
    return `a clean clone of ${this.url}${this.ref ? ` at ${this.ref}` : ""}`;
  }

  /** The clone is private to the server: no tool argument needs to name it. */
  root(): null {
    return null;
  }

  /** Starts the clone now (startup), without waiting; a failure is reported at first use. */
  prefetch(): void {
    this.start().catch(() => {});
  }

  async resolve(signal?: AbortSignal): Promise<DefaultSeedInfo> {
    // The clone is shared by every call; a cancelled call stops waiting, the clone goes on.
    const info = await abortable(this.start(), signal);
    this.used = true;
    return info;
  }

  private start(): Promise<DefaultSeedInfo> {
    if (this.closed) return Promise.reject(new PyroError("conflict", "the server is shutting down"));
    if (!this.clone) {
      this.clone = this.cloneOnce();
      // A failed clone (network, typo) is retried by the next create, not cached.
      this.clone.catch(() => {
        this.clone = undefined;
      });
    }
    return this.clone;
  }

  private async cloneOnce(): Promise<DefaultSeedInfo> {
    if (this.reposDir) await mkdir(this.reposDir, { recursive: true, mode: 0o700 });
    const tmp = await mkdtemp(join(this.reposDir ?? tmpdir(), this.reposDir ? "server-" : "pyro-mcp-clone-"));
    this.tmp = tmp;
    const dir = join(tmp, "repo");
    try {
      const { commit } = await cloneRepo(this.url, this.ref, dir, {
        hint: "check the server's --repo-url and --repo-ref",
      });
      return {
        origin: "repo_url",
        path: dir,
        repo_url: this.url,
        ...(this.ref ? { repo_ref: this.ref } : {}),
        ...(commit ? { commit } : {}),
      };
    } catch (err) {
      await rm(tmp, { recursive: true, force: true });
      throw err;
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.clone?.catch(() => {});
    if (this.tmp && !(this.used && this.reposDir)) await rm(this.tmp, { recursive: true, force: true });
  }
}

/** Starts cloning a --repo-url seed in the background, so the first create waits less. */
export function prefetch(seed: DefaultSeed): void {
  if (seed instanceof RepoSeed) seed.prefetch();
}

function abortable<T>(p: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return p;
  if (signal.aborted) return Promise.reject(new PyroError("cancelled", "the operation was cancelled"));
  return new Promise<T>((resolvePromise, reject) => {
    const onAbort = () => reject(new PyroError("cancelled", "the operation was cancelled"));
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener("abort", onAbort);
        resolvePromise(v);
      },
      (err) => {
        signal.removeEventListener("abort", onAbort);
        reject(err);
      },
    );
  });
}
