import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import http from "node:http";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { ChunkedDecoder } from "../../../src/net/http-framing.js";
import { createEgressProxy, type EgressProxy } from "../../../src/net/proxy.js";

/**
 * The proxy's plain-HTTP forwarding at the byte level (src/net/http-forward.ts): an
 * upstream on loopback answers each request with bytes a test scripts, so framings Node's
 * own server would not send (interim 1xx, odd chunk splits, close-delimited bodies,
 * truncation, garbage) reach the proxy; the client is a raw socket or Node's client.
 */

let dir: string;
let upstream: net.Server;
let port: number;
/** What the upstream received, per connection; and what it answers with next. */
const seen: string[] = [];
let answer: (socket: net.Socket) => void = () => {};
/** When the upstream has read enough to answer: by default, a request's head. */
let ready = (got: string) => got.includes("\r\n\r\n");
/** Called with each new upstream connection (a test makes it read slowly). */
let onConnection: (socket: net.Socket) => void = () => {};
const proxies: EgressProxy[] = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-fwd-"));
  upstream = net.createServer((s) => {
    s.on("error", () => {});
    onConnection(s);
    let got = "";
    const at = seen.push("") - 1;
    let answered = false;
    s.on("data", (c) => {
      got += c.toString("latin1");
      seen[at] = got;
      if (!answered && ready(got)) {
        answered = true;
        answer(s);
      }
    });
  });
  await new Promise<void>((r) => upstream.listen(0, "127.0.0.1", r));
  port = (upstream.address() as net.AddressInfo).port;
});

afterEach(async () => {
  seen.length = 0;
  ready = (got) => got.includes("\r\n\r\n");
  onConnection = () => {};
  await Promise.all(proxies.splice(0).map((p) => p.close()));
});

afterAll(async () => {
  upstream.close();
  await rm(dir, { recursive: true, force: true });
});

async function startProxy(): Promise<string> {
  const proxy = createEgressProxy({
    decide: () => ({ allowed: true }),
    onBlock: () => {},
    testHosts: new Map([["up.test", "127.0.0.1"]]),
    resolve: async () => {
      throw new Error("the real resolver must not be used in tests");
    },
  });
  proxies.push(proxy);
  const path = join(dir, `p-${randomBytes(3).toString("hex")}.sock`);
  await new Promise<void>((r) => proxy.server.listen(path, r));
  return path;
}

/** Each upstream connection answers with these pieces, written apart, then maybe closes. */
function answerWith(pieces: string[], close = true): void {
  answer = (s) => {
    let i = 0;
    const next = () => {
      if (i < pieces.length) s.write(pieces[i++]!, "latin1", () => setTimeout(next, 5));
      else if (close) s.end();
    };
    next();
  };
}

/** Sends raw requests on one connection; resolves with what came back once `done` holds. */
function raw(path: string, request: string, done: (text: string) => boolean, ms = 5000): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = net.connect(path);
    let text = "";
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error(`timed out: ${JSON.stringify(text)}`));
    }, ms);
    const finish = () => {
      clearTimeout(timer);
      s.destroy();
      resolve(text);
    };
    s.on("data", (c) => {
      text += c.toString("latin1");
      if (done(text)) finish();
    });
    s.on("close", finish);
    s.on("error", () => {});
    s.write(request);
  });
}

const get = (_path: string, target = "/x") =>
  `GET http://up.test:${port}${target} HTTP/1.1\r\nHost: up.test:${port}\r\nProxy-Connection: keep-alive\r\n\r\n`;

describe("plain-HTTP forwarding", () => {
  it("relays a chunked body however it is split, and keeps the client's connection for the next request", async () => {
    answerWith([
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r",
      "\nhel",
      "lo\r\n6\r\n world\r\n0\r\n",
      "\r\n",
    ]);
    const path = await startProxy();
    const text = await raw(path, get(path) + get(path, "/y"), (t) => t.split("\r\n0\r\n\r\n").length === 3);
    const responses = text.split("HTTP/1.1 200 OK").slice(1);
    expect(responses).toHaveLength(2);
    for (const r of responses) {
      expect(r).toMatch(/transfer-encoding: chunked/i);
      expect(r.replace(/\r\n[0-9a-f]+\r\n/g, "")).toContain("hello world");
      expect(r).not.toMatch(/connection: close/i);
    }
    expect(seen.map((s) => s.split("\r\n")[0])).toEqual(["GET /x HTTP/1.1", "GET /y HTTP/1.1"]);
  });

  it("drops interim 1xx responses, strips hop-by-hop fields both ways and relays a length body exactly", async () => {
    answerWith([
      "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
      "HTTP/1.1 201 Created\r\nContent-Length: 4\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=77\r\nX-End: 2\r\n\r\nbodyEXTRA",
    ]);
    const path = await startProxy();
    const request =
      `GET http://up.test:${port}/a HTTP/1.1\r\nHost: up.test:${port}\r\nProxy-Authorization: Basic eA==\r\n` +
      "Connection: X-Mine\r\nX-Mine: 1\r\nX-Keep: 2\r\n\r\n";
    const text = await raw(path, request, (t) => t.endsWith("body"));
    expect(text).toMatch(/^HTTP\/1\.1 201 Created\r\n/);
    expect(text).not.toMatch(/100 Continue|103|x-hop|timeout=77/i);
    expect(text).toMatch(/x-end: 2/i);
    await new Promise((r) => setTimeout(r, 100));
    const sent = seen[0]!;
    expect(sent).toMatch(/\r\nConnection: close\r\n/);
    expect(sent).toMatch(/X-Keep: 2/);
    expect(sent).not.toMatch(/proxy-authorization|x-mine/i);
  });

  it("ends a close-delimited body with the upstream, and a HEAD response without a body", async () => {
    answerWith(["HTTP/1.1 200 OK\r\n\r\nall of", " it"]);
    const path = await startProxy();
    const res = await new Promise<string>((resolve, reject) => {
      http
        .get({ socketPath: path, path: `http://up.test:${port}/`, agent: false }, (r) => {
          let body = "";
          r.on("data", (c) => (body += c));
          r.on("end", () => resolve(body));
        })
        .on("error", reject);
    });
    expect(res).toBe("all of it");
    answerWith(["HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n"], false);
    const head = get(path).replace("GET", "HEAD");
    const text = await raw(path, head + head, (t) => t.split("200 OK").length === 3);
    expect(text.match(/content-length: 99/gi)).toHaveLength(2);
  });

  it("cuts off a client whose body the upstream truncated, and answers 502 to garbage", async () => {
    answerWith(["HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part"]);
    const path = await startProxy();
    const aborted = await new Promise<string>((resolve) => {
      http
        .get({ socketPath: path, path: `http://up.test:${port}/`, agent: false }, (r) => {
          r.on("data", () => {});
          r.on("end", () => resolve("ended"));
          r.on("aborted", () => resolve("aborted"));
          r.on("error", () => resolve("aborted"));
        })
        .on("error", () => resolve("aborted"));
    });
    expect(aborted).toBe("aborted");
    for (const garbage of [
      "SSH-2.0-OpenSSH\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    ]) {
      answerWith([garbage]);
      const text = await raw(path, get(path), (t) => t.includes("malformed response"));
      expect(text).toMatch(/^HTTP\/1\.1 502 Bad Gateway\r\n/);
    }
    answerWith([]);
    expect(await raw(path, get(path), (t) => t.includes("\r\n\r\n") && t.includes("before"))).toMatch(
      /^HTTP\/1\.1 502/,
    );
  });

  it("sends a chunked request body upstream chunked", async () => {
    answerWith(["HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]);
    ready = (got) => got.endsWith("0\r\n\r\n");
    const path = await startProxy();
    const request =
      `POST http://up.test:${port}/p HTTP/1.1\r\nHost: up.test:${port}\r\nTransfer-Encoding: chunked\r\n\r\n` +
      "3\r\nxyz\r\n2\r\nuv\r\n0\r\n\r\n";
    expect(await raw(path, request, (t) => t.endsWith("ok"))).toMatch(/^HTTP\/1\.1 200 OK/);
    await new Promise((r) => setTimeout(r, 100));
    const sent = seen[0]!;
    expect(sent).toMatch(/Transfer-Encoding: chunked\r\n/);
    const body = sent.slice(sent.indexOf("\r\n\r\n") + 4);
    expect(body.replace(/[0-9a-f]+\r\n|\r\n/g, "")).toBe("xyzuv");
    expect(body.endsWith("0\r\n\r\n")).toBe(true);
  });

  it("keeps a large chunked upload's framing whole when the upstream reads slowly", async () => {
    onConnection = (s) => {
      s.pause();
      setTimeout(() => s.resume(), 300);
    };
    ready = (got) => got.endsWith("\r\n0\r\n\r\n");
    answerWith(["HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]);
    const path = await startProxy();
    const payload = "a".repeat(8_000_000);
    const request =
      `POST http://up.test:${port}/big HTTP/1.1\r\nHost: up.test:${port}\r\nTransfer-Encoding: chunked\r\n\r\n` +
      `${payload.length.toString(16)}\r\n${payload}\r\n0\r\n\r\n`;
    expect(await raw(path, request, (t) => t.endsWith("ok"))).toMatch(/^HTTP\/1\.1 200 OK/);
    const sent = Buffer.from(seen[0]!, "latin1");
    const out = new ChunkedDecoder().push(sent.subarray(sent.indexOf("\r\n\r\n") + 4));
    expect(out.done).toBe(true);
    expect(Buffer.concat(out.data).length).toBe(payload.length);
  });

  it("frames a request body itself, whatever the Connection field lists and however many fields come", async () => {
    const smuggled = "GET /admin HTTP/1.1\r\nHost: other.test\r\n\r\n";
    ready = (got) => got.endsWith(smuggled);
    answerWith(["HTTP/1.1 204 No Content\r\n\r\n"]);
    const path = await startProxy();
    for (const extra of ["Connection: content-length\r\n", "a: b\r\n".repeat(2100)]) {
      const request =
        `POST http://up.test:${port}/p HTTP/1.1\r\nHost: up.test:${port}\r\n${extra}` +
        `Content-Length: ${smuggled.length}\r\n\r\n${smuggled}`;
      expect(await raw(path, request, (t) => t.includes("\r\n\r\n"))).toMatch(/^HTTP\/1\.1 204/);
      const sent = seen.at(-1)!;
      expect(sent.slice(0, sent.indexOf("\r\n\r\n") + 4)).toMatch(
        new RegExp(`\r\nContent-Length: ${smuggled.length}\r\n`),
      );
    }
  });

  it("waits for a slow upstream's drain without piling up listeners", async () => {
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(w.name);
    process.on("warning", onWarning);
    const timers: NodeJS.Timeout[] = [];
    onConnection = (s) => {
      s.on("data", () => s.pause());
      timers.push(setInterval(() => s.resume(), 3));
    };
    const total = 24 * 1024 * 1024;
    ready = (got) => got.length >= total;
    answerWith(["HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]);
    try {
      const path = await startProxy();
      const head = `PUT http://up.test:${port}/p HTTP/1.1\r\nHost: up.test:${port}\r\nContent-Length: ${total}\r\n\r\n`;
      const text = await raw(path, head + "b".repeat(total), (t) => t.endsWith("ok"), 30_000);
      expect(text).toMatch(/^HTTP\/1\.1 200 OK/);
      expect(warnings).not.toContain("MaxListenersExceededWarning");
    } finally {
      process.off("warning", onWarning);
      for (const t of timers) clearInterval(t);
    }
  });

  it("refuses a response head with bare LF line ends at once, and writes one Content-Length", async () => {
    answerWith(["HTTP/1.1 200 OK\nContent-Length: 2\n\nok"], false);
    const path = await startProxy();
    expect(await raw(path, get(path), (t) => t.includes("malformed response"))).toMatch(
      /^HTTP\/1\.1 502 .*bare LF/s,
    );
    answerWith(["HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\nContent-Length: 2\r\n\r\nok"]);
    const text = await raw(path, get(path), (t) => t.endsWith("ok"));
    expect(text.match(/content-length: [^\r]*/gi)).toEqual(["Content-Length: 2"]);
  });
});
