import { describe, expect, it } from "vitest";
import {
  canonicalJson,
  findEnvironment,
  OFFICIAL_ENVIRONMENTS,
  recipeKey,
} from "../../../src/env/catalog.js";
import { PyroError } from "../../../src/errors.js";

describe("environment catalog", () => {
  it("lists exactly the official environments of the contract (§3 and the §10 toolchains)", () => {
    expect(OFFICIAL_ENVIRONMENTS.map((e) => e.name)).toEqual([
      "debian:12",
      "debian:12-base",
      "debian:12-build",
      "debian:12-node",
      "debian:12-python",
    ]);
  });

  it("makes the toolchain environments recipes over debian:12 pinned to its recipe key", () => {
    const node = findEnvironment("debian:12-node").source;
    const python = findEnvironment("debian:12-python").source;
    if (node.kind !== "recipe" || python.kind !== "recipe") throw new Error("kind");
    expect(node).toMatchObject({ from: "debian:12", base_key: recipeKey(findEnvironment("debian:12")) });
    expect(node.apt).toEqual(["nodejs", "npm"]);
    expect(python.apt).toEqual(["python3-pip", "python3-venv"]);
  });

  it("takes any OCI reference as an environment, normalized (Docker Hub shorthand included)", () => {
    expect(findEnvironment("library/python:3.12")).toMatchObject({
      name: "docker.io/library/python:3.12",
      source: { kind: "oci", reference: "docker.io/library/python:3.12" },
    });
    expect(findEnvironment("localhost:5000/team/img").name).toBe("localhost:5000/team/img:latest");
    const d = `sha256:${"a".repeat(64)}`;
    expect(findEnvironment(`ghcr.io/org/img@${d}`).name).toBe(`ghcr.io/org/img@${d}`);
    expect(() => findEnvironment("Not A/Ref!")).toThrow(PyroError);
    // A bare name:tag is never silently a Docker Hub pull (a misspelt official name).
    expect(() => findEnvironment("debain:12")).toThrow(/unknown environment/);
  });

  it("gives debian:12 the contract's tools and debian:12-build build-essential on top", () => {
    const d12 = findEnvironment("debian:12").source;
    const build = findEnvironment("debian:12-build").source;
    const base = findEnvironment("debian:12-base").source;
    if (d12.kind !== "debootstrap" || build.kind !== "debootstrap" || base.kind !== "debootstrap")
      throw new Error("kind");
    expect(d12.include).toEqual(["ca-certificates", "curl", "git", "make", "python3"]);
    expect(build.include).toEqual([...d12.include, "build-essential"].sort());
    expect(base.include).toEqual([]);
    expect(base.variant).toBe("minbase");
  });

  it("rejects a name that is neither official nor an image reference with environment_not_found and a hint listing the known ones", () => {
    try {
      findEnvironment("Debian 12");
      expect.unreachable();
    } catch (err) {
      expect(err).toBeInstanceOf(PyroError);
      expect((err as PyroError).code).toBe("environment_not_found");
      expect((err as PyroError).hint).toContain("debian:12-base");
    }
  });

  it("keys recipes by content: stable, distinct per environment, changed by any package change", () => {
    const keys = OFFICIAL_ENVIRONMENTS.map(recipeKey);
    expect(new Set(keys).size).toBe(OFFICIAL_ENVIRONMENTS.length);
    expect(recipeKey(findEnvironment("debian:12"))).toBe(keys[0]);
    const spec = findEnvironment("debian:12");
    if (spec.source.kind !== "debootstrap") throw new Error("kind");
    const changed = { ...spec, source: { ...spec.source, include: [...spec.source.include, "vim"] } };
    expect(recipeKey(changed)).not.toBe(keys[0]);
    expect(recipeKey({ ...spec, description: "other words" })).toBe(keys[0]);
  });

  it("serialises objects with sorted keys so equal recipes hash equally", () => {
    expect(canonicalJson({ b: 1, a: [2, { d: 3, c: 4 }] })).toBe('{"a":[2,{"c":4,"d":3}],"b":1}');
  });
});
