/**
 * The built-in op handlers, one per op named in the protocol. Ops whose modules pull in
 * npm packages (diff and .gitignore matching, tar, node-pty) or are rarely used are
 * loaded on their first call: an agent starts in every sandbox start and reset, and
 * what it does not import it neither waits for nor keeps in memory.
 */
import type { OpName } from "../../op-schemas.js";
import type { OpHandler, OpHandlers } from "./context.js";
import { exec } from "./exec.js";
import { fileList, fileRead, fileWrite } from "./files.js";
import { refuseWhileResetting, reset } from "./reset.js";
import { serviceList, serviceLogs, serviceStart, serviceStatus, serviceStop } from "./services.js";
import { info, ping } from "./system.js";

/** A handler whose module is imported on the first call. */
function lazy<O extends OpName>(load: () => Promise<OpHandler<O>>): OpHandler<O> {
  let loaded: Promise<OpHandler<O>> | undefined;
  return async (args, ctx) => {
    loaded ??= load();
    return (await loaded)(args, ctx);
  };
}

const diffOps = () => import("./diff.js");
const patchOps = () => import("./patch.js");
const tarOps = () => import("./tar.js");
const vmOps = () => import("./vm.js");
const shellOps = () => import("./shells.js");

/** An op that starts processes: refused while a reset is under way (ops/reset.ts). */
function spawning<O extends OpName>(handler: OpHandler<O>): OpHandler<O> {
  return (args, ctx) => {
    refuseWhileResetting();
    return handler(args, ctx);
  };
}

export type { OpContext, OpHandler, OpHandlers } from "./context.js";

/** Every op the agent implements. */
export const BUILTIN_OPS: OpHandlers = {
  ping,
  info,
  reset,
  exec: spawning(exec),
  file_list: fileList,
  file_read: fileRead,
  file_write: fileWrite,
  patch_apply: lazy(async () => (await patchOps()).patchApply),
  diff: lazy(async () => (await diffOps()).diff),
  tar_out: lazy(async () => (await tarOps()).tarOut),
  tar_in: lazy(async () => (await tarOps()).tarIn),
  vm_setup: lazy(async () => (await vmOps()).vmSetup),
  vm_snapshot_in: lazy(async () => (await vmOps()).vmSnapshotIn),
  vm_sync: lazy(async () => (await vmOps()).vmSync),
  service_start: spawning(serviceStart),
  service_list: serviceList,
  service_status: serviceStatus,
  service_logs: serviceLogs,
  service_stop: serviceStop,
  shell_open: spawning(lazy(async () => (await shellOps()).shellOpen)),
  shell_write: lazy(async () => (await shellOps()).shellWrite),
  shell_read: lazy(async () => (await shellOps()).shellRead),
  shell_signal: lazy(async () => (await shellOps()).shellSignal),
  shell_resize: lazy(async () => (await shellOps()).shellResize),
  shell_close: lazy(async () => (await shellOps()).shellClose),
  shell_list: lazy(async () => (await shellOps()).shellList),
};
