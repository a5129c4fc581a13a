import { describe, expect, it } from "vitest";
import {
  bodyFraming,
  ChunkedDecoder,
  HttpFramingError,
  parseResponseHead,
  type ResponseHead,
} from "../../../src/net/http-framing.js";

const b = (s: string) => Buffer.from(s, "latin1");
const head = (status: number, fields: [string, string][] = []): ResponseHead => ({
  status,
  reason: "",
  fields,
  length: 0,
});

describe("parseResponseHead", () => {
  it("waits for the blank line, then reads the status, reason and fields in order", () => {
    expect(parseResponseHead(b("HTTP/1.1 200 OK\r\nA: 1\r\n"), 1024)).toBeNull();
    const h = parseResponseHead(b("HTTP/1.1 404 Not Found\r\nX-A:  one \r\nx-a: two\r\n\r\nbody"), 1024);
    expect(h).toEqual({
      status: 404,
      reason: "Not Found",
      fields: [
        ["X-A", "one"],
        ["x-a", "two"],
      ],
      length: 48,
    });
    expect(parseResponseHead(b("HTTP/1.0 204\r\n\r\n"), 1024)?.reason).toBe("");
  });

  it("refuses malformed lines, folded fields, control bytes and heads over the limit", () => {
    const bad = [
      "HTTP/2 200 OK\r\n\r\n",
      "HTTP/1.1 20 OK\r\n\r\n",
      "ICY 200 OK\r\n\r\n",
      "HTTP/1.1 200 OK\r\nNo-Colon\r\n\r\n",
      "HTTP/1.1 200 OK\r\nA: 1\r\n folded\r\n\r\n",
      "HTTP/1.1 200 OK\r\nBad Name: 1\r\n\r\n",
      "HTTP/1.1 200 OK\r\nA: x\0y\r\n\r\n",
      "HTTP/1.1 200 OK\r\nA: x\ry\r\n\r\n",
      "HTTP/1.1 200 OK\nA: 1\r\n\r\n",
      "HTTP/1.1 200 OK\r\nA: 1\n",
    ];
    for (const text of bad) expect(() => parseResponseHead(b(text), 1024), text).toThrow(HttpFramingError);
    expect(() => parseResponseHead(b(`HTTP/1.1 200 OK\r\nA: ${"x".repeat(100)}`), 64)).toThrow(/over 64/);
    expect(() => parseResponseHead(b(`HTTP/1.1 200 OK\r\nA: ${"x".repeat(100)}\r\n\r\n`), 64)).toThrow(
      /over 64/,
    );
  });
});

describe("bodyFraming", () => {
  it("has no body for HEAD, 204 and 304", () => {
    const cl: [string, string][] = [["Content-Length", "10"]];
    expect(bodyFraming("HEAD", head(200, cl))).toEqual({ kind: "none" });
    expect(bodyFraming("GET", head(204, cl))).toEqual({ kind: "none" });
    expect(bodyFraming("GET", head(304, cl))).toEqual({ kind: "none" });
  });

  it("prefers Transfer-Encoding over Content-Length, and ends other codings by close", () => {
    const both: [string, string][] = [
      ["Content-Length", "10"],
      ["Transfer-Encoding", "gzip, Chunked"],
    ];
    expect(bodyFraming("GET", head(200, both))).toEqual({ kind: "chunked" });
    expect(bodyFraming("GET", head(200, [["Transfer-Encoding", "chunked, gzip"]]))).toEqual({
      kind: "close",
    });
    expect(bodyFraming("GET", head(200, []))).toEqual({ kind: "close" });
  });

  it("takes one Content-Length, repeated or not, and refuses conflicting or invalid ones", () => {
    expect(bodyFraming("GET", head(200, [["content-length", "5, 5"]]))).toEqual({ kind: "length", bytes: 5 });
    for (const v of [["1", "2"], ["-1"], ["1e3"], ["0x10"], [""]]) {
      const fields = v.map((x): [string, string] => ["Content-Length", x]);
      if (v[0] === "") expect(bodyFraming("GET", head(200, fields))).toEqual({ kind: "close" });
      else expect(() => bodyFraming("GET", head(200, fields)), v.join()).toThrow(HttpFramingError);
    }
  });
});

describe("ChunkedDecoder", () => {
  const wire =
    "5;ext=1\r\nhello\r\n19\r\n, chunked and split at ra\r\n4\r\nndom\r\n0\r\nTrailer: x\r\n\r\nNEXT";

  it("decodes the same bytes however they are split, and hands back what follows", () => {
    for (const step of [1, 2, 3, 7, wire.length]) {
      const d = new ChunkedDecoder();
      const data: Buffer[] = [];
      let rest = "";
      let done = false;
      for (let i = 0; i < wire.length && !done; i += step) {
        const out = d.push(b(wire.slice(i, i + step)));
        data.push(...out.data);
        done = out.done;
        if (done) rest = out.rest.toString("latin1") + wire.slice(i + step);
      }
      expect(done, `step ${step}`).toBe(true);
      expect(Buffer.concat(data).toString(), `step ${step}`).toBe("hello, chunked and split at random");
      expect(rest, `step ${step}`).toBe("NEXT");
    }
  });

  it("ends at a last chunk without trailers", () => {
    const out = new ChunkedDecoder().push(b("2\r\nok\r\n0\r\n\r\n"));
    expect(out.done).toBe(true);
    expect(Buffer.concat(out.data).toString()).toBe("ok");
  });

  it("refuses a bad size, data longer than its size, a bare LF and an endless size line", () => {
    const bad = ["zz\r\n", "2\r\nokX\r\n", "2\nok\r\n", "-1\r\n", `1${";x".repeat(3000)}\r\n`];
    for (const text of bad) expect(() => new ChunkedDecoder().push(b(text)), text).toThrow(HttpFramingError);
  });
});
