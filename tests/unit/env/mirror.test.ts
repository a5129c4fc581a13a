import { describe, expect, it } from "vitest";
import { parseMirror, resolveMirror } from "../../../src/env/mirror.js";

describe("Debian mirror detection", () => {
  it("reads the main archive from a deb822 sources file and skips the security suite", () => {
    const text = [
      "Types: deb",
      "URIs: http://security.example/debian-security",
      "Suites: bookworm-security",
      "Components: main",
      "",
      "Types: deb",
      "# a comment",
      "URIs: http://mirror.example/debian/",
      "Suites: bookworm bookworm-updates",
      "Components: main",
    ].join("\n");
    expect(parseMirror(text)).toBe("http://mirror.example/debian");
  });

  it("reads the one-line format with options", () => {
    expect(parseMirror("# x\ndeb [arch=amd64] http://m.example/debian bookworm main\n")).toBe(
      "http://m.example/debian",
    );
  });

  it("returns null when nothing fits", () => {
    expect(parseMirror("deb http://m.example/debian-security bookworm-security main")).toBeNull();
  });

  it("prefers the configured mirror (PYRO_DEBIAN_MIRROR) over the host's apt configuration", async () => {
    expect(await resolveMirror("http://override.example/debian/", "/nonexistent")).toBe(
      "http://override.example/debian",
    );
    expect(await resolveMirror(undefined, "/nonexistent")).toBe("http://deb.debian.org/debian");
  });
});
