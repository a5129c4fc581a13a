// A network client run inside a workspace by the parity network scenarios: each
// argument is one check, each prints one JSON line. It reads the proxy from HTTP_PROXY
// as any tool would. Plain Node (CommonJS, no dependencies): it runs on the sandbox's
// injected runtime.
const net = require("node:net");

const proxy = process.env.HTTP_PROXY ? new URL(process.env.HTTP_PROXY) : null;
const TIMEOUT_MS = 3000;

function viaProxy() {
  if (!proxy) return Promise.reject(new Error("no HTTP_PROXY"));
  return dial(proxy.hostname, Number(proxy.port));
}

function dial(host, port) {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host, port });
    const t = setTimeout(() => {
      s.destroy();
      reject(new Error("timeout"));
    }, TIMEOUT_MS);
    s.once("connect", () => {
      clearTimeout(t);
      resolve(s);
    });
    s.once("error", (e) => {
      clearTimeout(t);
      reject(e);
    });
  });
}

/** Everything the socket says until it closes (or the timeout). */
function drain(s, first = Buffer.alloc(0)) {
  return new Promise((resolve) => {
    let buf = first;
    const t = setTimeout(() => s.destroy(), TIMEOUT_MS);
    s.on("data", (d) => {
      buf = Buffer.concat([buf, d]);
    });
    s.on("close", () => {
      clearTimeout(t);
      resolve(buf);
    });
    s.on("error", () => {});
  });
}

/** Reads until `n` bytes or a "\n" when n is 0. */
function readSome(s, stopAt) {
  return new Promise((resolve) => {
    let buf = Buffer.alloc(0);
    const t = setTimeout(() => done(), TIMEOUT_MS);
    const done = () => {
      clearTimeout(t);
      s.off("data", onData);
      resolve(buf);
    };
    const onData = (d) => {
      buf = Buffer.concat([buf, d]);
      if (stopAt(buf)) done();
    };
    s.on("data", onData);
    s.on("close", done);
  });
}

const checks = {
  // GET http://TARGET/ through the proxy (absolute URI).
  async http(target) {
    const s = await viaProxy();
    s.write(`GET http://${target}/ HTTP/1.1\r\nHost: ${target}\r\nConnection: close\r\n\r\n`);
    const text = (await drain(s)).toString();
    const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(text)?.[1] ?? 0);
    return { status, body: text.split("\r\n\r\n").slice(1).join("\r\n\r\n").slice(0, 200) };
  },
  // CONNECT TARGET, then a line to the echo server behind it.
  async connect(target) {
    const s = await viaProxy();
    s.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`);
    const head = await readSome(s, (b) => b.includes("\r\n\r\n"));
    const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(head.toString())?.[1] ?? 0);
    if (status !== 200) return { status };
    s.write("ping\n");
    const echo = (await readSome(s, (b) => b.includes(10))).toString();
    s.destroy();
    return { status, echo };
  },
  // SOCKS5 CONNECT by domain name, then a line to the echo server.
  async socks(target) {
    const [host, port] = [
      target.slice(0, target.lastIndexOf(":")),
      Number(target.slice(target.lastIndexOf(":") + 1)),
    ];
    const s = await viaProxy();
    s.write(Buffer.from([5, 1, 0]));
    const method = await readSome(s, (b) => b.length >= 2);
    if (method[1] !== 0) return { reply: -1 };
    const name = Buffer.from(host);
    s.write(
      Buffer.concat([Buffer.from([5, 1, 0, 3, name.length]), name, Buffer.from([port >> 8, port & 255])]),
    );
    const rep = await readSome(s, (b) => b.length >= 10);
    const reply = rep.length >= 2 ? rep[1] : -1;
    if (reply !== 0) return { reply };
    s.write("ping\n");
    const echo = (await readSome(s, (b) => b.includes(10))).toString();
    s.destroy();
    return { reply, echo };
  },
  // A direct TCP connection, without the proxy: must fail in a sandbox.
  async direct(target) {
    const i = target.lastIndexOf(":");
    try {
      const s = await dial(target.slice(0, i).replace(/^\[|\]$/g, ""), Number(target.slice(i + 1)));
      s.destroy();
      return { connected: true };
    } catch (e) {
      return { connected: false, error: e.code ?? e.message };
    }
  },
  env() {
    const names = ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"];
    return Object.fromEntries(
      names.flatMap((n) => [
        [n, process.env[n] ?? null],
        [n.toLowerCase(), process.env[n.toLowerCase()] ?? null],
      ]),
    );
  },
};

(async () => {
  for (const arg of process.argv.slice(2)) {
    const [kind, target] = arg.split("=");
    let result;
    try {
      result = await checks[kind](target);
    } catch (e) {
      result = { failed: e.code ?? e.message };
    }
    process.stdout.write(`${JSON.stringify({ check: arg, ...result })}\n`);
  }
})();
