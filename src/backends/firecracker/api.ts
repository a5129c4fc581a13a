import { request } from "node:http";
import { PyroError } from "../../errors.js";
import { withSocketPath } from "../sockpath.js";

/**
 * A small client for Firecracker's HTTP API on its unix socket. Field names follow the
 * API's swagger definition (src/firecracker/swagger/firecracker.yaml upstream); every
 * request has a deadline, and a refusal surfaces Firecracker's own `fault_message`.
 */

export interface BootSource {
  kernel_image_path: string;
  initrd_path?: string;
  boot_args: string;
}

export interface Drive {
  /** Firecracker accepts only alphanumerics and `_` in ids (checked_id in its API server). */
  drive_id: string;
  /** Relative paths resolve against Firecracker's working directory. */
  path_on_host: string;
  is_root_device: false;
  is_read_only: boolean;
}

export interface DriveUpdate {
  drive_id: string;
  path_on_host: string;
}

export interface MachineConfig {
  vcpu_count: number;
  mem_size_mib: number;
  smt: false;
}

export interface Vsock {
  guest_cid: number;
  uds_path: string;
}

export interface SnapshotCreate {
  snapshot_type: "Full";
  snapshot_path: string;
  mem_file_path: string;
}

/**
 * `enable_diff_snapshots` is left out on purpose: current releases deprecate it in favour
 * of `track_dirty_pages`, older ones reject that unknown field, and both default to false.
 */
export interface SnapshotLoad {
  snapshot_path: string;
  mem_backend: { backend_type: "File"; backend_path: string };
  resume_vm: boolean;
}

/** One request as sent (for logs and tests). */
export interface ApiCall {
  method: "GET" | "PUT" | "PATCH";
  path: string;
  body?: unknown;
}

const DEFAULT_TIMEOUT_MS = 10_000;
/** Creating or loading a snapshot reads or writes the whole guest memory. */
const SNAPSHOT_TIMEOUT_MS = 120_000;
const MAX_RESPONSE_BYTES = 64 * 1024;

export class FirecrackerApi {
  constructor(
    readonly socketPath: string,
    private readonly options: { timeoutMs?: number; signal?: AbortSignal } = {},
  ) {}

  putMachineConfig(config: MachineConfig): Promise<void> {
    return this.call({ method: "PUT", path: "/machine-config", body: config });
  }

  putBootSource(source: BootSource): Promise<void> {
    return this.call({ method: "PUT", path: "/boot-source", body: source });
  }

  putDrive(id: string, drive: Drive): Promise<void> {
    return this.call({ method: "PUT", path: `/drives/${encodeURIComponent(id)}`, body: drive });
  }

  /** Tells a started VM that a drive's backing file (path or size) changed: the guest rescans it. */
  patchDrive(id: string, update: DriveUpdate): Promise<void> {
    return this.call({ method: "PATCH", path: `/drives/${encodeURIComponent(id)}`, body: update });
  }

  putVsock(vsock: Vsock): Promise<void> {
    return this.call({ method: "PUT", path: "/vsock", body: vsock });
  }

  instanceStart(): Promise<void> {
    return this.call({ method: "PUT", path: "/actions", body: { action_type: "InstanceStart" } });
  }

  pause(): Promise<void> {
    return this.call({ method: "PATCH", path: "/vm", body: { state: "Paused" } });
  }

  resume(): Promise<void> {
    return this.call({ method: "PATCH", path: "/vm", body: { state: "Resumed" } });
  }

  createSnapshot(params: SnapshotCreate): Promise<void> {
    return this.call({ method: "PUT", path: "/snapshot/create", body: params }, SNAPSHOT_TIMEOUT_MS);
  }

  loadSnapshot(params: SnapshotLoad): Promise<void> {
    return this.call({ method: "PUT", path: "/snapshot/load", body: params }, SNAPSHOT_TIMEOUT_MS);
  }

  /** Sends one request; resolves on 2xx, otherwise rejects with `backend_unavailable`. */
  call(req: ApiCall, timeoutMs = this.options.timeoutMs ?? DEFAULT_TIMEOUT_MS): Promise<void> {
    return withSocketPath(this.socketPath, (usable) => this.send(usable, req, timeoutMs));
  }

  private send(socketPath: string, req: ApiCall, timeoutMs: number): Promise<void> {
    const what = `firecracker API ${req.method} ${req.path}`;
    const payload = req.body === undefined ? undefined : Buffer.from(JSON.stringify(req.body));
    const signal = this.options.signal;
    return new Promise<void>((resolve, reject) => {
      if (signal?.aborted) {
        reject(new PyroError("cancelled", `${what} was cancelled`));
        return;
      }
      let settled = false;
      const finish = (err: PyroError | null) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        if (err) {
          outgoing.destroy();
          reject(err);
        } else resolve();
      };
      const onAbort = () => finish(new PyroError("cancelled", `${what} was cancelled`));
      const timer = setTimeout(
        () => finish(new PyroError("timeout", `${what}: no answer within ${timeoutMs} ms`)),
        timeoutMs,
      );
      // One connection per request (agent: false): no pooled socket outlives the call.
      const outgoing = request(
        {
          socketPath,
          method: req.method,
          path: req.path,
          agent: false,
          headers: {
            Accept: "application/json",
            ...(payload ? { "Content-Type": "application/json", "Content-Length": payload.length } : {}),
          },
        },
        (res) => {
          const chunks: Buffer[] = [];
          let size = 0;
          res.on("data", (chunk: Buffer) => {
            size += chunk.length;
            if (size <= MAX_RESPONSE_BYTES) chunks.push(chunk);
          });
          res.on("error", (err) => finish(new PyroError("backend_unavailable", `${what}: ${err.message}`)));
          res.on("end", () => {
            const status = res.statusCode ?? 0;
            if (status >= 200 && status < 300) finish(null);
            else
              finish(
                new PyroError(
                  "backend_unavailable",
                  `${what}: ${faultMessage(Buffer.concat(chunks).toString("utf8"), status)}`,
                ),
              );
          });
        },
      );
      outgoing.on("error", (err) =>
        finish(
          new PyroError("backend_unavailable", `${what}: cannot reach ${this.socketPath}: ${err.message}`),
        ),
      );
      signal?.addEventListener("abort", onAbort, { once: true });
      outgoing.end(payload);
    });
  }
}

/** Firecracker's error body is `{"fault_message": "..."}`; anything else is shown as is. */
export function faultMessage(body: string, status: number): string {
  try {
    const parsed = JSON.parse(body) as unknown;
    if (parsed && typeof parsed === "object" && "fault_message" in parsed) {
      const msg = (parsed as { fault_message: unknown }).fault_message;
      if (typeof msg === "string" && msg) return msg;
    }
  } catch {
    // not JSON
  }
  const text = body.trim().slice(0, 500);
  return text ? `HTTP ${status}: ${text}` : `HTTP ${status}`;
}
