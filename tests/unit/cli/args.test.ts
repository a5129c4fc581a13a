import { describe, expect, it } from "vitest";
import { commandString, keyValues, shellQuote } from "../../../src/cli/args.js";

describe("CLI argument helpers", () => {
  it("passes one argument through as a shell command string", () => {
    expect(commandString(["make test && echo ok"])).toBe("make test && echo ok");
  });

  it("quotes several arguments so the shell sees exactly that argv", () => {
    expect(commandString(["git", "--version"])).toBe("git --version");
    expect(commandString(["echo", "a b", "it's", "$HOME", ""])).toBe(`echo 'a b' 'it'\\''s' '$HOME' ''`);
    expect(shellQuote("semi;colon")).toBe("'semi;colon'");
  });

  it("refuses an empty command and malformed KEY=VALUE options", () => {
    expect(() => commandString([])).toThrow(/no command/);
    expect(() => keyValues(["novalue"], "--env")).toThrow(/KEY=VALUE/);
    expect(keyValues(["A=1", "B=x=y"], "--env")).toEqual({ A: "1", B: "x=y" });
  });
});
