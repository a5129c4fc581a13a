/**
 * What `pyro doctor` reports about networking (docs/network.md): per backend, which
 * policies it applies and through which channel, and whether the egress proxy answers
 * on this host. Apart from core/network.ts, which every workspace operation loads.
 */
import { join } from "node:path";
import type { WorkspaceBackend } from "../backends/backend.js";
import { makeDirs } from "../util/fs.js";

/** What doctor reports about networking: per backend, what it can apply and how. */
export interface NetworkDoctor {
  /** The egress proxy could serve a connection on this host just now. */
  proxy: { ok: boolean; reason: string | null };
  backends: Record<string, { policies: string[]; published_ports: boolean; channel: string }>;
}

/** How each backend reaches its helper, in words for doctor (docs/network.md). */
function channelOf(b: WorkspaceBackend): string {
  if (b.executionMode === "host_compat") return "a loopback proxy port (no isolation: not enforced)";
  if (b.egressNamespace) return "the helper's own listener in the sandbox's network namespace";
  if (b.connectPort) return "the proxy's unix socket, bound read-only into the sandbox";
  if (b.connectNet) return "the network mux on the VM's agent channel";
  return "none: only the off policy";
}

/** Proves the proxy can listen and answer here: a unix socket in `dir`, one refused request. */
export async function networkDoctor(
  backends: readonly WorkspaceBackend[],
  dir: string,
): Promise<NetworkDoctor> {
  const report: NetworkDoctor = { proxy: { ok: false, reason: null }, backends: {} };
  for (const b of backends) {
    const can = Boolean(b.connectPort || b.connectNet);
    report.backends[b.name] = {
      policies: can ? ["off", "egress", "allowlist"] : ["off"],
      published_ports: can,
      channel: channelOf(b),
    };
  }
  const { createEgressProxy } = await import("../net/proxy.js");
  const { mkdtemp, rm } = await import("node:fs/promises");
  const net = await import("node:net");
  await makeDirs(dir, 0o700);
  const tmp = await mkdtemp(join(dir, "netcheck-"));
  const proxy = createEgressProxy({
    decide: () => ({ allowed: false, reason: "doctor" }),
    onBlock: () => {},
  });
  try {
    const path = join(tmp, "p.sock");
    await new Promise<void>((resolve, reject) => {
      proxy.server.once("error", reject);
      proxy.server.listen(path, () => resolve());
    });
    const answer = await new Promise<string>((resolve, reject) => {
      const s = net.connect(path);
      let got = "";
      s.on("data", (d) => {
        got += d.toString();
      });
      s.on("close", () => resolve(got));
      s.on("error", reject);
      s.write("CONNECT doctor.invalid:443 HTTP/1.1\r\n\r\n");
      setTimeout(() => s.destroy(), 3000).unref();
    });
    report.proxy = answer.startsWith("HTTP/1.1 403")
      ? { ok: true, reason: null }
      : { ok: false, reason: `unexpected answer: ${answer.slice(0, 60)}` };
  } catch (err) {
    report.proxy = { ok: false, reason: (err as Error).message };
  } finally {
    await proxy.close();
    await rm(tmp, { recursive: true, force: true });
  }
  return report;
}
