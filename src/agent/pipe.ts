/**
 * Byte-stream plumbing shared by every hop of the network path (the guest's forwarders,
 * the host's proxy and network helper): on the bottom floor, so each can use it.
 */
import type net from "node:net";
import type { Duplex } from "node:stream";

/** Copies bytes both ways; when either side closes or fails, both go. */
export function splice(a: Duplex, b: Duplex): void {
  const end = () => {
    a.destroy();
    b.destroy();
  };
  for (const s of [a, b]) {
    s.on("error", end);
    s.on("close", end);
  }
  a.pipe(b);
  b.pipe(a);
}

/** `server.listen(where)` as a promise that rejects on a listen error (a port in use). */
export function listen(server: net.Server, where: net.ListenOptions): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(where, () => {
      server.off("error", reject);
      resolve();
    });
  });
}
