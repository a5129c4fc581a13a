import { Readable } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { checkMaxOutputBytes, LiveRedactor, parseMaxOutputBytes } from "../../../src/core/output.js";
import { PyroError } from "../../../src/errors.js";
import type { Pyro } from "../../../src/sdk/pyro.js";
import { redactor } from "../../../src/state/redact.js";
import { fakePyro } from "../../helpers/engine.js";

const SEQ = Array.from({ length: 200_000 }, (_, i) => `${i + 1}\n`).join("");
const MARKER = /\[\.\.\. (\d+) bytes omitted \.\.\.\]\n/;

/** SEQ cut at `cap`: its first and last cap/2 bytes around a marker that starts a line. */
function cut(cap: number): string {
  const head = SEQ.slice(0, cap / 2);
  const nl = head.endsWith("\n") ? "" : "\n";
  return `${head}${nl}[... ${SEQ.length - cap} bytes omitted ...]\n${SEQ.slice(-cap / 2)}`;
}

function codeOf(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    if (err instanceof PyroError) return err.code;
    throw err;
  }
  return "none";
}

async function rejectsWith(p: Promise<unknown>): Promise<PyroError> {
  const err = await p.then(
    () => new Error("expected a rejection"),
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(PyroError);
  return err as PyroError;
}

describe("max_output_bytes values", () => {
  it("takes bytes, k/KiB and m/MiB", () => {
    expect(parseMaxOutputBytes("65536")).toBe(65536);
    expect(parseMaxOutputBytes("64k")).toBe(65536);
    expect(parseMaxOutputBytes("64KiB")).toBe(65536);
    expect(parseMaxOutputBytes("1m")).toBe(1024 * 1024);
    expect(parseMaxOutputBytes("4MiB")).toBe(4 * 1024 * 1024);
    expect(parseMaxOutputBytes("1024")).toBe(1024);
  });

  it("refuses what is not a size, or is under 1 KiB or over 4 MiB, as invalid_argument naming the flag", () => {
    for (const bad of ["abc", "-1", "0", "100", "1023", "5m", "1e3", "", "1.5k", "12 parsecs"]) {
      let err: PyroError | undefined;
      try {
        parseMaxOutputBytes(bad);
      } catch (e) {
        err = e as PyroError;
      }
      expect(err, bad).toBeInstanceOf(PyroError);
      expect(err!.code).toBe("invalid_argument");
      expect(err!.message).toContain("--max-output-bytes");
      expect(err!.message).not.toContain("\n");
    }
    for (const bad of [0, 1023, 4 * 1024 * 1024 + 1, 2.5, Number.NaN, "2048", null]) {
      expect(codeOf(() => checkMaxOutputBytes(bad))).toBe("invalid_argument");
    }
    expect(checkMaxOutputBytes(4 * 1024 * 1024)).toBe(4 * 1024 * 1024);
  });
});

describe("SDK output cap", () => {
  let fx: Awaited<ReturnType<typeof fakePyro>>;
  let pyro: Pyro;
  let id: string;
  beforeAll(async () => {
    fx = await fakePyro();
    pyro = fx.pyro;
    id = (await pyro.createWorkspace({ ttlSeconds: 600 })).workspace_id;
  });
  afterAll(() => fx.cleanup());

  it("execWorkspace keeps the head and tail at 1 MiB by default, with full sizes", async () => {
    const r = await pyro.execWorkspace(id, "seq 1 200000");
    expect(r).toMatchObject({ truncated: true, stdout_bytes: SEQ.length, stderr_bytes: 0 });
    expect(r.stdout).toBe(cut(1024 * 1024));
    expect(MARKER.exec(r.stdout)![1]).toBe(String(SEQ.length - 1024 * 1024));
  });

  it("execWorkspace takes maxOutputBytes, and the history still keeps 1 MiB of the stream", async () => {
    const r = await pyro.execWorkspace(id, "seq 1 200000", { maxOutputBytes: 2048 });
    expect(r.stdout).toBe(cut(2048));
    const logs = await pyro.workspaceLogs(id, { seq: r.seq });
    const c = logs.commands[0]!;
    expect(c).toMatchObject({ seq: r.seq, full_output: true, stdout_bytes: SEQ.length, truncated: true });
    expect(c.stdout).toBe(cut(1024 * 1024));
    const again = await pyro.workspaceLogs(id, { seq: r.seq, maxOutputBytes: 4096 });
    expect(again.commands[0]!.stdout).toBe(cut(4096));
    // The listing keeps tails and sizes.
    const listed = (await pyro.workspaceLogs(id)).commands.at(-1)!;
    expect(listed).toMatchObject({ stdout_bytes: SEQ.length, stderr_bytes: 0 });
    expect(listed.stdout.endsWith("200000\n")).toBe(true);
    expect("full_output" in listed).toBe(false);
  });

  it("refuses a bad maxOutputBytes before running anything", async () => {
    const before = (await pyro.workspaceLogs(id)).count;
    for (const bad of [10, 64 * 1024 * 1024, 1.5]) {
      expect((await rejectsWith(pyro.execWorkspace(id, "echo ran", { maxOutputBytes: bad }))).code).toBe(
        "invalid_argument",
      );
    }
    expect((await pyro.workspaceLogs(id)).count).toBe(before);
    expect((await rejectsWith(pyro.workspaceLogs(id, { seq: 999 }))).code).toBe("not_found");
    expect((await rejectsWith(pyro.run("debian:12", "true", { maxOutputBytes: 5 }))).code).toBe(
      "invalid_argument",
    );
  });

  it("run takes maxOutputBytes and reports full sizes", async () => {
    const r = await pyro.run("debian:12", "seq 1 200000", { maxOutputBytes: 2048 });
    expect(r).toMatchObject({ truncated: true, stdout_bytes: SEQ.length, exit_code: 0 });
    expect(r.stdout.endsWith(SEQ.slice(-1024))).toBe(true);
    expect(r.stdout.startsWith(SEQ.slice(0, 1024))).toBe(true);
  });
});

describe("LiveRedactor", () => {
  const secrets = new Map([
    ["SHORT", "abcd"],
    ["LONG", "abcdefgh"],
    ["TOKEN", "s3cr3t-t0ken"],
  ]);
  const feed = (chunks: string[]) => {
    const r = new LiveRedactor(secrets, redactor(secrets));
    return Buffer.concat([...chunks.map((c) => r.push(Buffer.from(c))), r.end()]).toString();
  };

  it("redacts a secret split across chunks, whatever the split", () => {
    const text = "before s3cr3t-t0ken after abcdefgh and abcd.\n";
    const whole = redactor(secrets)(text);
    expect(whole).toBe("before [REDACTED:TOKEN] after [REDACTED:LONG] and [REDACTED:SHORT].\n");
    for (let i = 1; i < text.length; i++) {
      expect(feed([text.slice(0, i), text.slice(i)])).toBe(whole);
    }
    expect(feed(text.split(""))).toBe(whole);
  });

  it("writes at once all but what could still be the start of a secret", () => {
    const r = new LiveRedactor(secrets, redactor(secrets));
    // The longest secret has 12 characters: the last 11 wait for the next chunk.
    const text = "progress 10%\nprogress 20%\n";
    expect(r.push(Buffer.from(text)).toString()).toBe(text.slice(0, text.length - 11));
    expect(r.end().toString()).toBe(text.slice(text.length - 11));
  });

  it("passes bytes through untouched when there are no secrets", () => {
    const r = new LiveRedactor(new Map(), (t) => t);
    const binary = Buffer.from([0xff, 0x00, 0xc3]);
    expect(r.push(binary)).toBe(binary);
    expect(r.end()).toHaveLength(0);
  });
});

describe("live output and stdin through the SDK", () => {
  let fx: Awaited<ReturnType<typeof fakePyro>>;
  afterAll(() => fx?.cleanup());

  it("execWorkspace sends output to on_output as it comes, secrets redacted, and reads stdin", async () => {
    fx = await fakePyro();
    const w = await fx.pyro.createWorkspace({ secrets: { API_KEY: "k3y-value-123" } });
    const seen: string[] = [];
    const r = await fx.pyro.execWorkspace(w.workspace_id, 'cat; printf "key=$API_KEY\\n" >&2', {
      onOutput: (stream, chunk) => seen.push(`${stream}:${chunk.toString()}`),
      stdin: Readable.from([Buffer.from("from stdin\n")]),
    });
    expect(r).toMatchObject({ stdout: "from stdin\n", stderr: "key=[REDACTED:API_KEY]\n" });
    expect(seen.filter((s) => s.startsWith("stdout:")).join("")).toBe("stdout:from stdin\n");
    expect(
      seen
        .filter((s) => s.startsWith("stderr:"))
        .map((s) => s.slice(7))
        .join(""),
    ).toBe("key=[REDACTED:API_KEY]\n");
  });
});
