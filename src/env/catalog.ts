import { createHash } from "node:crypto";
import { PyroError } from "../errors.js";
import { formatReference, parseReference } from "./oci/reference.js";

/**
 * The environment catalog: named root filesystems and the recipe that makes each one.
 * A recipe names its source; today the only source is `debootstrap` (built locally
 * from Debian's archive). A registry source (`oci`) plugs in as a second kind beside
 * it, with its own builder (see `Builder` in builder.ts).
 */
export interface DebootstrapSource {
  kind: "debootstrap";
  suite: string;
  variant: "minbase";
  /** Extra packages beyond the variant's base set, sorted. */
  include: string[];
  arch: "amd64";
}

export interface OciSource {
  kind: "oci";
  reference: string;
}

/**
 * A recipe: a base environment plus steps, built in a sandbox (src/env/recipe.ts).
 * `base_key` pins the base's content (its recipe key, and for an image its digest), so a
 * changed base makes a new entry.
 */
export interface RecipeSource {
  kind: "recipe";
  from: string;
  base_key: string;
  apt: string[];
  run: string[];
  /** Host files copied in: `dest` in the environment, `sha256` of the tree copied (where it came from is not part of the key). */
  copy: { dest: string; sha256: string }[];
}

export type EnvironmentSource = DebootstrapSource | OciSource | RecipeSource;

export interface EnvironmentSpec {
  name: string;
  description: string;
  source: EnvironmentSource;
}

/**
 * Bumped when the way a source becomes a rootfs changes (post-processing, layout):
 * everything built by an older recipe becomes stale.
 */
export const RECIPE_VERSION = 1;

const BOOKWORM = { kind: "debootstrap", suite: "bookworm", variant: "minbase", arch: "amd64" } as const;
const DEFAULT_TOOLS = ["ca-certificates", "curl", "git", "make", "python3"];

const DEBIAN_12: EnvironmentSpec = {
  name: "debian:12",
  description: "Debian 12 minbase plus git, ca-certificates, curl, python3 and make",
  source: { ...BOOKWORM, include: DEFAULT_TOOLS },
};

/**
 * Toolchain environments: built-in recipes over debian:12 (Debian's own packages,
 * installed in a sandbox with network egress; src/core/recipes.ts). Their key pins
 * debian:12's recipe, so a new debian:12 recipe rebuilds them.
 */
function toolchain(name: string, description: string, apt: string[]): EnvironmentSpec {
  return {
    name,
    description,
    source: {
      kind: "recipe",
      from: DEBIAN_12.name,
      base_key: recipeKey(DEBIAN_12),
      apt: [...apt].sort(),
      run: [],
      copy: [],
    },
  };
}

export const OFFICIAL_ENVIRONMENTS: readonly EnvironmentSpec[] = [
  DEBIAN_12,
  {
    name: "debian:12-base",
    description: "Debian 12 minbase only",
    source: { ...BOOKWORM, include: [] },
  },
  {
    name: "debian:12-build",
    description: "debian:12 plus build-essential",
    source: { ...BOOKWORM, include: [...DEFAULT_TOOLS, "build-essential"].sort() },
  },
  toolchain("debian:12-node", "debian:12 plus Debian's nodejs and npm", ["nodejs", "npm"]),
  toolchain("debian:12-python", "debian:12 plus python3-pip and python3-venv", [
    "python3-pip",
    "python3-venv",
  ]),
];

export const DEFAULT_ENVIRONMENT = "debian:12";

/**
 * The spec for an environment name: an official environment, or any OCI image
 * reference with a '/' or a digest (`library/python:3.12` is
 * `docker.io/library/python:3.12`), named by its normalized reference so every
 * spelling shares one cache entry.
 */
export function findEnvironment(name: string): EnvironmentSpec {
  const spec = OFFICIAL_ENVIRONMENTS.find((e) => e.name === name);
  if (spec) return spec;
  let reference: string | null = null;
  // A bare `name:tag` is an environment name, never silently a Docker Hub image: a typo of
  // an official name must not become a registry pull. Images have a '/' or a digest.
  if (name.includes("/") || name.includes("@")) {
    try {
      reference = formatReference(parseReference(name));
    } catch {
      reference = null;
    }
  }
  if (reference === null) {
    throw new PyroError(
      "environment_not_found",
      `unknown environment '${name}'`,
      `use an official environment (${OFFICIAL_ENVIRONMENTS.map((e) => e.name).join(", ")}), one built with \`pyro env build\`, or an image reference such as docker.io/library/python:3.12`,
    );
  }
  return { name: reference, description: `OCI image ${reference}`, source: { kind: "oci", reference } };
}

/**
 * The cache key of a recipe: a hash over everything that changes the built root
 * filesystem (source, packages, recipe version). The mirror is deliberately not part
 * of it: the same suite from another mirror is the same content.
 */
export function recipeKey(spec: EnvironmentSpec): string {
  const canonical = canonicalJson({ recipe: RECIPE_VERSION, source: spec.source });
  return createHash("sha256").update(canonical).digest("hex").slice(0, 16);
}

/** JSON with sorted object keys, so equal recipes hash equally. */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const obj = value as Record<string, unknown>;
    return `{${Object.keys(obj)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonicalJson(obj[k])}`)
      .join(",")}}`;
  }
  return JSON.stringify(value);
}

/** A filesystem-safe directory name for an environment at a recipe key. */
export function entryDirName(spec: EnvironmentSpec, key: string): string {
  return `${spec.name.replace(/[^A-Za-z0-9._-]/g, "_")}@${key}`;
}
