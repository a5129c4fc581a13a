import { statSync } from "node:fs";
import { join } from "node:path";
import type { Duplex } from "node:stream";
import type { AgentClient } from "../../agent/client.js";
import { packTree } from "../../agent/tarsafe.js";
import type { SandboxSpec, SandboxState } from "../backend.js";
import { openDiskView } from "../bwrap/disk-view.js";
import { vmDiskView } from "./disk-view.js";
import { treeId } from "./disks.js";
import { GUEST } from "./types.js";

/**
 * Snapshot trees inside a VM guest. The current snapshot is the seed disk; any other one a
 * diff needs is pushed into the guest once per VM (it lives on the state disk, so a reset,
 * which replaces that disk, starts without them).
 */
export class GuestSnapshots {
  /** Pushed or being pushed: `<pid>:<start time>/<guest name>`. */
  private readonly pushed = new Map<string, Promise<void>>();

  /** Where the agent sees snapshot `name`. */
  path(spec: SandboxSpec, name: string): string {
    if (name === spec.snapshot) return GUEST.seedDir;
    return `${GUEST.snapshotsDir}/${guestSnapshotName(spec, name)}`;
  }

  /** Pushes snapshot `name` into the VM `state` unless it is there (or on its way) already. */
  async expose(spec: SandboxSpec, state: SandboxState, name: string, agent: AgentClient): Promise<void> {
    if (name === spec.snapshot) return;
    const guestName = guestSnapshotName(spec, name);
    const key = `${state.pid}:${state.start_time}/${guestName}`;
    let p = this.pushed.get(key);
    if (!p) {
      p = (async () => {
        const { stream } = await packTree(join(spec.snapshotsDir, name), ["."]);
        await agent.request(
          "vm_snapshot_in",
          { name: guestName },
          { upload: stream, timeoutMs: 30 * 60_000 },
        );
      })();
      this.pushed.set(key, p);
      p.catch(() => this.pushed.delete(key));
    }
    await p;
  }
}

/** Guest directory name of a snapshot tree: its name plus the host tree's identity (re-created snapshots differ). */
function guestSnapshotName(spec: SandboxSpec, name: string): string {
  try {
    return `${name}-${treeId(statSync(join(spec.snapshotsDir, name)))}`;
  } catch {
    return name;
  }
}

/**
 * What the microVM backends share about the guest's view: /workspace, and snapshot trees
 * (the current one is the seed disk; others are pushed on demand).
 */
export abstract class MicroVmBackend {
  private readonly snapshots = new GuestSnapshots();

  /** The workspace's state disk (its writable layers) and its format. */
  protected abstract stateDiskFile(spec: SandboxSpec): { path: string; format: "qcow2" | "raw" };

  /** A stopped workspace's files, read on the host from a checked copy of its state disk (disk-view.ts). */
  async openDisk(spec: SandboxSpec): Promise<Duplex> {
    return openDiskView(spec, await vmDiskView(spec, this.stateDiskFile(spec)));
  }

  agentRoot(): string {
    return GUEST.workspace;
  }

  agentSnapshotPath(spec: SandboxSpec, name: string): string {
    return this.snapshots.path(spec, name);
  }

  exposeSnapshot(spec: SandboxSpec, state: SandboxState, name: string, agent: AgentClient): Promise<void> {
    return this.snapshots.expose(spec, state, name, agent);
  }
}
