import { createHash } from "node:crypto";
import { cp, lstat, readdir, readFile, readlink, realpath } from "node:fs/promises";
import { isAbsolute, join, relative, resolve, sep } from "node:path";
import { parse as parseToml } from "smol-toml";
import { PyroError } from "../errors.js";
import type { BuildContext, Builder, BuildOutput } from "./builder.js";
import { type EnvironmentSpec, OFFICIAL_ENVIRONMENTS, type RecipeSource } from "./catalog.js";

/** A recipe as a user writes it (CLI flags, SDK, MCP, `.pyro/environment.toml`). */
export interface RecipeInput {
  name: string;
  from: string;
  apt?: string[];
  run?: string[];
  /** `SRC:DEST` strings or objects; SRC is a host path (relative to `baseDir`), DEST absolute in the environment. */
  copy?: (string | { src: string; dest: string })[];
}

/** Where a seed repository keeps its recipe. */
export const RECIPE_FILE = ".pyro/environment.toml";

const NAME = /^[a-z0-9][a-z0-9._-]{0,62}(?::[A-Za-z0-9._-]{1,64})?$/;
const APT = /^[a-z0-9][a-z0-9+.-]*(?:=[A-Za-z0-9.+~:-]+)?$/;
const MAX_STEPS = 64;

function bad(message: string, hint = "see `pyro env build --help`"): PyroError {
  return new PyroError("invalid_argument", message, hint);
}

export function checkRecipeName(name: string): void {
  if (!NAME.test(name)) {
    throw bad(
      `'${name}' is not a valid environment name`,
      "use lowercase letters, digits, '.', '_' or '-', with an optional :TAG",
    );
  }
  if (OFFICIAL_ENVIRONMENTS.some((e) => e.name === name)) {
    throw bad(`'${name}' is an official environment`, "pick another name for a built environment");
  }
}

export interface CheckedRecipe {
  name: string;
  from: string;
  apt: string[];
  run: string[];
  copy: { src: string; dest: string }[];
}

/** Validates a recipe; copy sources become absolute (relative ones against `baseDir`, which they must stay inside when `confine`). */
export function checkRecipe(input: RecipeInput, baseDir: string, confine = false): CheckedRecipe {
  checkRecipeName(input.name);
  if (typeof input.from !== "string" || input.from.trim() === "")
    throw bad("a recipe needs `from` (its base environment)");
  const apt = [...new Set(input.apt ?? [])];
  for (const p of apt)
    if (typeof p !== "string" || !APT.test(p)) throw bad(`'${p}' is not a Debian package name`);
  const run = input.run ?? [];
  for (const c of run) if (typeof c !== "string" || c.trim() === "") throw bad("a run step is empty");
  const copy = (input.copy ?? []).map((c) => {
    let src: string;
    let dest: string;
    if (typeof c === "string") {
      const i = c.lastIndexOf(":");
      if (i <= 0) throw bad(`copy '${c}' is not SRC:DEST`);
      src = c.slice(0, i);
      dest = c.slice(i + 1);
    } else if (c && typeof c === "object" && typeof c.src === "string" && typeof c.dest === "string") {
      ({ src, dest } = c);
    } else throw bad("a copy is SRC:DEST or {src, dest}");
    if (!dest.startsWith("/") || dest.split("/").includes(".."))
      throw bad(`copy destination '${dest}' must be an absolute path without '..'`);
    const abs = resolve(baseDir, src);
    if (confine && (isAbsolute(src) || relative(baseDir, abs).startsWith(".."))) {
      throw bad(
        `copy source '${src}' is outside the repository`,
        "recipe files copy paths inside their repository only",
      );
    }
    return { src: abs, dest };
  });
  if (apt.length + run.length + copy.length === 0)
    throw bad("the recipe has no steps", "add --apt, --run or --copy");
  if (run.length + copy.length > MAX_STEPS) throw bad(`more than ${MAX_STEPS} steps`);
  return { name: input.name, from: input.from.trim(), apt: apt.sort(), run, copy };
}

/**
 * Refuses `path` unless it is really inside `repo`: no component between the repository
 * and the path (the path itself included) may be a symbolic link, and its real path must
 * lie under the repository's real path. A repository is untrusted content: a link in it
 * (`link -> /etc`) must not turn a copy of `link/hostname` into a read of the host.
 * Returns false when the path does not exist.
 */
export async function insideRepo(repo: string, path: string, what: string): Promise<boolean> {
  const base = resolve(repo);
  const rel = relative(base, resolve(path));
  if (rel.startsWith("..") || isAbsolute(rel)) throw outside(what);
  let p = base;
  for (const part of rel === "" ? [] : rel.split(sep)) {
    p = join(p, part);
    const st = await lstat(p).catch(() => null);
    if (!st) return false;
    if (st.isSymbolicLink()) {
      throw bad(
        `${what} goes through the symbolic link '${relative(base, p)}'`,
        "a repository's recipe copies real files and directories of the repository only, never through a link",
      );
    }
  }
  const [realBase, realPath] = await Promise.all([realpath(base), realpath(p)]);
  const realRel = relative(realBase, realPath);
  if (realRel.startsWith("..") || isAbsolute(realRel)) throw outside(what);
  return true;
}

function outside(what: string): PyroError {
  return bad(`${what} is outside the repository`, "recipe files copy paths inside their repository only");
}

/** Reads `.pyro/environment.toml` of a repository, or null when there is none. */
export async function readRecipeFile(repo: string, name: string): Promise<CheckedRecipe | null> {
  let text: string;
  try {
    if (!(await insideRepo(repo, join(repo, RECIPE_FILE), RECIPE_FILE))) return null;
    text = await readFile(join(repo, RECIPE_FILE), "utf8");
  } catch (err) {
    if (err instanceof PyroError) throw err;
    return null;
  }
  let data: Record<string, unknown>;
  try {
    data = parseToml(text) as Record<string, unknown>;
  } catch (err) {
    throw bad(`${RECIPE_FILE} is not valid TOML: ${(err as Error).message.split("\n")[0]}`, "fix the file");
  }
  const known = new Set(["from", "apt", "run", "copy", "name"]);
  for (const k of Object.keys(data))
    if (!known.has(k)) throw bad(`${RECIPE_FILE}: unknown key '${k}'`, "keys: from, apt, run, copy");
  const list = (k: string) => {
    const v = data[k];
    if (v === undefined) return [];
    if (typeof v === "string") return [v];
    if (Array.isArray(v)) return v;
    throw bad(`${RECIPE_FILE}: '${k}' must be a string or a list`);
  };
  const copy = list("copy") as RecipeInput["copy"] & object[];
  const recipe = checkRecipe(
    {
      name: typeof data.name === "string" ? data.name : name,
      from: typeof data.from === "string" ? data.from : "",
      apt: list("apt") as string[],
      run: list("run") as string[],
      copy,
    },
    repo,
    true,
  );
  for (const [i, c] of recipe.copy.entries()) {
    const entry = copy[i];
    const what = `${RECIPE_FILE}: copy '${typeof entry === "string" ? entry : `${entry?.src}:${entry?.dest}`}'`;
    if (!(await insideRepo(repo, c.src, what)))
      throw bad(`${what}: the source does not exist`, "fix the file");
  }
  return recipe;
}

/** A content hash of a host file or directory tree (paths, modes, link targets, bytes). */
export async function hashTree(path: string): Promise<string> {
  const h = createHash("sha256");
  const walk = async (p: string, rel: string): Promise<void> => {
    const st = await lstat(p).catch(() => null);
    if (!st) throw bad(`copy source '${path}' does not exist`);
    h.update(`${rel}\0${st.mode}\0`);
    if (st.isSymbolicLink()) h.update(await readlink(p));
    else if (st.isFile()) h.update(await readFile(p));
    else if (st.isDirectory())
      for (const c of (await readdir(p)).sort()) await walk(join(p, c), `${rel}/${c}`);
    h.update("\0");
  };
  await walk(path, ".");
  return h.digest("hex");
}

/**
 * Copies a copy step's source to `dest` (files, directories, modes, times). Symbolic
 * links are copied as links with their target text as written, never followed, whether
 * the source is a link or a link sits inside a copied directory: a link in a tree cannot
 * pull a host file into the environment (inside the sandbox it resolves against the
 * sandbox's own root). `hashTree` hashes the same way.
 */
export async function copySource(src: string, dest: string): Promise<void> {
  await cp(src, dest, {
    recursive: true,
    dereference: false,
    preserveTimestamps: true,
    verbatimSymlinks: true,
  });
}

/** The source of a recipe over a pulled base (`base_key` pins the base's content). */
export async function recipeSource(r: CheckedRecipe, baseKey: string): Promise<RecipeSource> {
  return {
    kind: "recipe",
    from: r.from,
    base_key: baseKey,
    apt: r.apt,
    run: r.run,
    copy: await Promise.all(r.copy.map(async (c) => ({ dest: c.dest, sha256: await hashTree(c.src) }))),
  };
}

/**
 * Builds recipe environments. The work happens in the core (src/core/recipes.ts: a
 * sandbox on a real backend with network egress); this adapter lets the cache own
 * locking, atomicity and keys as for every other source.
 */
export class RecipeBuilder implements Builder {
  readonly kind = "recipe" as const;

  constructor(private readonly runner: (spec: EnvironmentSpec, ctx: BuildContext) => Promise<BuildOutput>) {}

  build(spec: EnvironmentSpec, ctx: BuildContext): Promise<BuildOutput> {
    return this.runner(spec, ctx);
  }
}
