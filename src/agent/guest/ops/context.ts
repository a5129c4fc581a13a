/**
 * What an op handler receives besides its arguments. Kept apart from server.ts so the
 * ops do not depend on the session machinery.
 */
import type { Readable } from "node:stream";
import type { OpName, OpParsedArgs, OpResult } from "../../op-schemas.js";
import type { Workspace } from "../paths.js";

export interface OpContext {
  /** The workspace root and its containment rules. */
  workspace: Workspace;
  /** Aborted when the host cancels the request or the connection closes. */
  signal: AbortSignal;
  /** The uploaded stream, for ops that take one (tar_in); null otherwise. */
  upload: Readable | null;
  /**
   * Sends bytes on the request's channel (ops that stream a download). Resolves when
   * the transport can take more. Calling it, even with an empty chunk, opens the
   * stream; the session ends it after the op succeeds.
   */
  send(chunk: Uint8Array): Promise<void>;
  /** Scratch space outside the workspace (spooled uploads). */
  tmpDir: string;
  /** Inside a microVM: the agent disk's mount point (its busybox does mounts, clock). */
  vmDir: string | null;
  /** Commands run at nice 19, below the agent (see GuestOptions.idleCommands). */
  idleCommands?: boolean;
}

/** Implementation of one op: validated args in, a result matching its schema out. */
export type OpHandler<O extends OpName> = (args: OpParsedArgs<O>, ctx: OpContext) => Promise<OpResult<O>>;

/** One handler per op. */
export type OpHandlers = { [O in OpName]: OpHandler<O> };
