import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { cli } from "../helpers/cli.js";

/**
 * Bad input on the CLI (issue 11, item 4): every refusal is one line on stderr (or the
 * error object under --json) with the right exit code, never a stack trace, and nothing
 * is made. These are refused before any backend is asked, so they run on any machine.
 */
let home: string;
let env: NodeJS.ProcessEnv;
beforeAll(async () => {
  home = await mkdtemp(join(tmpdir(), "pyro-cli-bad-"));
  env = { PYRO_HOME: home, PYRO_ENV_CACHE: join(home, "environments") };
});
afterAll(async () => {
  await rm(home, { recursive: true, force: true });
});

const noTrace = (text: string) => expect(text).not.toMatch(/\n\s+at |PyroError:|file:\/\//);

describe("numeric options", () => {
  const cases: [string[], RegExp][] = [
    [
      ["run", "debian:12", "--timeout", "abc", "--", "true"],
      /--timeout must be a positive number, got 'abc'/,
    ],
    [["run", "debian:12", "--timeout", "-1", "--", "true"], /--timeout must be a positive number/],
    [["run", "debian:12", "--timeout", "0", "--", "true"], /--timeout must be a positive number/],
    [
      ["run", "debian:12", "--timeout", "1e309", "--", "true"],
      /--timeout must be a positive number, got '1e309'/,
    ],
    [["run", "debian:12", "--vcpus", "abc", "--", "true"], /--vcpus must be a whole number/],
    [["run", "debian:12", "--vcpus", "-1", "--", "true"], /--vcpus must be a whole number/],
    [["run", "debian:12", "--vcpus", "1.5", "--", "true"], /--vcpus must be a whole number/],
    [["workspace", "create", "--ttl=-5"], /--ttl must be a whole number/],
    [["workspace", "create", "--memory", "12x"], /--memory must be a whole number/],
    [["workspace", "exec", "w", "--timeout", "NaN", "--", "true"], /--timeout must be a positive number/],
  ];
  for (const [args, message] of cases) {
    it(`pyro ${args.join(" ")} is a usage error (exit 2), one line`, async () => {
      const r = await cli(args, env);
      expect(r.code).toBe(2);
      noTrace(r.stderr);
      expect(r.stderr.trim().split("\n")).toHaveLength(1);
      expect(r.stderr).toMatch(message);
      const j = await cli([...args, "--json"], env);
      expect(j.code).toBe(2);
      expect(j.json().error.code).toBe("invalid_argument");
    });
  }
});

describe("limits and seeds the core refuses before making anything", () => {
  it("--memory below the minimum is invalid_argument, not a sandbox that dies on start", async () => {
    const r = await cli(["workspace", "create", "--memory", "1", "--json"], env);
    expect(r.code).toBe(1);
    expect(r.json().error).toMatchObject({ code: "invalid_argument", message: "invalid memory limit 1" });
    expect((await cli(["run", "debian:12", "--memory", "1", "--", "true"], env)).stderr).toMatch(
      /invalid memory limit 1/,
    );
    expect((await cli(["run", "debian:12", "--vcpus", "65", "--", "true"], env)).stderr).toMatch(
      /invalid vcpus 65/,
    );
  });

  it("--repo-ref without --repo-url is refused, not ignored", async () => {
    const r = await cli(["workspace", "create", "--repo-ref", "main", "--json"], env);
    expect(r.code).toBe(1);
    expect(r.json().error.code).toBe("invalid_argument");
    expect(r.json().error.message).toMatch(/needs a repository URL/);
    expect((await cli(["workspace", "list", "--json"], env)).json().count).toBe(0);
  });
});

describe("network policies and published ports (issue 13)", () => {
  const create: [string[], RegExp][] = [
    [["--network", "allowlist:"], /network allowlist is empty/],
    [["--network", "bogus"], /unknown network policy "bogus"/],
    [["--publish", "0.0.0.0:80:80"], /bad published port '0\.0\.0\.0:80:80'/],
    [["--publish", "70000:80"], /published port 70000:80 is out of range/],
    [["--publish", "8080:80", "--publish", "8080:81"], /host port 8080 is published twice/],
  ];
  for (const [args, message] of create) {
    it(`pyro workspace create ${args.join(" ")} is invalid_argument and makes nothing`, async () => {
      const before = (await cli(["workspace", "list", "--json"], env)).json().count;
      const r = await cli(["workspace", "create", ...args], env);
      expect(r.code).toBe(1);
      noTrace(r.stderr);
      expect(r.stderr.trim().split("\n")[0]).toMatch(message);
      const j = await cli(["workspace", "create", ...args, "--json"], env);
      expect(j.code).toBe(1);
      noTrace(j.stderr);
      expect(j.json().error).toMatchObject({
        code: "invalid_argument",
        message: expect.stringMatching(message),
      });
      expect(j.json().error.hint).toBeTruthy();
      expect((await cli(["workspace", "list", "--json"], env)).json().count).toBe(before);
    });
  }

  const missing: string[][] = [
    ["workspace", "network", "approve", "NOSUCH", "example.com"],
    ["workspace", "network", "blocks", "NOSUCH"],
  ];
  for (const args of missing) {
    it(`pyro ${args.join(" ")} is workspace_not_found`, async () => {
      const r = await cli(args, env);
      expect(r.code).not.toBe(0);
      noTrace(r.stderr);
      expect(r.stderr).toMatch(/no workspace 'NOSUCH'/);
      const j = await cli([...args, "--json"], env);
      expect(j.code).not.toBe(0);
      noTrace(j.stderr);
      expect(j.json().error).toMatchObject({ code: "workspace_not_found", message: "no workspace 'NOSUCH'" });
    });
  }
});

describe("services (issue 14)", () => {
  const start = ["workspace", "service", "start", "NOSUCH", "web"];
  /** `--json` before the `--` that starts the command. */
  const json = (args: string[]) => {
    const i = args.indexOf("--");
    return i < 0 ? [...args, "--json"] : [...args.slice(0, i), "--json", ...args.slice(i)];
  };
  const usage: [string[], RegExp][] = [
    [[...start, "--ready-tcp", "0", "--", "sleep 60"], /--ready-tcp must be a port from 1 to 65535, got '0'/],
    [[...start, "--ready-tcp", "70000", "--", "sleep 60"], /--ready-tcp must be a port from 1 to 65535/],
    [[...start, "--ready-timeout", "0", "--", "sleep 60"], /--ready-timeout must be a positive number/],
    [
      ["workspace", "service", "logs", "NOSUCH", "web", "--tail-lines", "x"],
      /--tail-lines must be a whole number/,
    ],
  ];
  for (const [args, message] of usage) {
    it(`pyro ${args.join(" ")} is a usage error (exit 2), one line`, async () => {
      const r = await cli(args, env);
      expect(r.code).toBe(2);
      noTrace(r.stderr);
      expect(r.stderr.trim().split("\n")).toHaveLength(1);
      expect(r.stderr).toMatch(message);
      const j = await cli(json(args), env);
      expect(j.code).toBe(2);
      expect(j.json().error.code).toBe("invalid_argument");
    });
  }

  const refused: [string[], RegExp][] = [
    [
      [...start, "--ready-tcp", "8080", "--ready-file", "/tmp/up", "--", "sleep 60"],
      /at most one readiness probe, got --ready-file and --ready-tcp/,
    ],
    [[...start, "--", ""], /the service command is empty/],
    [[...start, "--", "   "], /the service command is empty/],
    [start, /no command given/],
    [["workspace", "service", "start", "NOSUCH", "bad name!", "--", "sleep 60"], /service name must be/],
    [
      ["workspace", "service", "logs", "NOSUCH", "web", "--tail-lines", "10001"],
      /--tail-lines must be at most 10000/,
    ],
  ];
  for (const [args, message] of refused) {
    it(`pyro ${args.join(" ")} is invalid_argument and changes nothing`, async () => {
      const r = await cli(args, env);
      expect(r.code).toBe(1);
      noTrace(r.stderr);
      expect(r.stderr.trim().split("\n")[0]).toMatch(message);
      const j = await cli(json(args), env);
      expect(j.code).toBe(1);
      noTrace(j.stderr);
      expect(j.json().error).toMatchObject({
        code: "invalid_argument",
        message: expect.stringMatching(message),
      });
      expect((await cli(["workspace", "list", "--json"], env)).json().count).toBe(0);
    });
  }

  const missing: string[][] = [
    [...start, "--ready-tcp", "8080", "--", "sleep", "60"],
    ["workspace", "service", "list", "NOSUCH"],
    ["workspace", "service", "status", "NOSUCH", "web"],
    ["workspace", "service", "logs", "NOSUCH", "web", "--tail-lines", "5"],
    ["workspace", "service", "stop", "NOSUCH", "web"],
  ];
  for (const args of missing) {
    it(`pyro ${args.join(" ")} is workspace_not_found`, async () => {
      const r = await cli(args, env);
      expect(r.code).not.toBe(0);
      noTrace(r.stderr);
      expect(r.stderr).toMatch(/no workspace 'NOSUCH'/);
      const j = await cli(json(args), env);
      expect(j.code).not.toBe(0);
      noTrace(j.stderr);
      expect(j.json().error).toMatchObject({ code: "workspace_not_found", message: "no workspace 'NOSUCH'" });
    });
  }
});

describe("bare pyro", () => {
  it("prints the help and exits 0", async () => {
    const r = await cli([], env);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^Usage: pyro/);
    expect(r.stderr).toBe("");
  });
});
