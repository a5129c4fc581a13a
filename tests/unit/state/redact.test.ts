import { describe, expect, it } from "vitest";
import { redact, redactor } from "../../../src/state/redact.js";

describe("redact", () => {
  it("replaces every occurrence of each secret with its name", () => {
    const secrets = new Map([
      ["TOKEN", "ghp_abc123"],
      ["PASS", "s3cr3t!"],
    ]);
    expect(redact("token=ghp_abc123 pass=s3cr3t! again ghp_abc123", secrets)).toBe(
      "token=[REDACTED:TOKEN] pass=[REDACTED:PASS] again [REDACTED:TOKEN]",
    );
  });

  it("leaves text without secrets untouched", () => {
    const text = "nothing to see\nhere: ghp_ab";
    expect(redact(text, new Map([["TOKEN", "ghp_abc123"]]))).toBe(text);
  });

  it("prefers the longest secret when one contains another", () => {
    const secrets = { SHORT: "abcd", LONG: "abcdefgh" };
    expect(redact("abcdefgh abcd", secrets)).toBe("[REDACTED:LONG] [REDACTED:SHORT]");
  });

  it("ignores values shorter than four characters", () => {
    expect(redact("a ab abc abcd", { X: "abc", Y: "" })).toBe("a ab abc abcd");
  });

  it("treats regular expression characters in a secret literally", () => {
    expect(redact("p=a.b*c+d a-b-c-d", { P: "a.b*c+d" })).toBe("p=[REDACTED:P] a-b-c-d");
  });

  it("does not redact inside its own markers", () => {
    expect(redact("REDACTED here", { R: "REDACTED", N: "here" })).toBe("[REDACTED:R] [REDACTED:N]");
  });

  it("binds secrets once for repeated use", () => {
    const r = redactor(new Map([["K", "key-value"]]));
    expect(r("a key-value")).toBe("a [REDACTED:K]");
    expect(r("key-valuekey-value")).toBe("[REDACTED:K][REDACTED:K]");
  });
});
