/** The built-in op handlers, one per op named in the protocol. */
import type { OpHandlers } from "./context.js";
import { diff } from "./diff.js";
import { exec } from "./exec.js";
import { fileList, fileRead, fileWrite } from "./files.js";
import { patchApply } from "./patch.js";
import { serviceList, serviceLogs, serviceStart, serviceStatus, serviceStop } from "./services.js";
import {
  shellClose,
  shellList,
  shellOpen,
  shellRead,
  shellResize,
  shellSignal,
  shellWrite,
} from "./shells.js";
import { info, ping } from "./system.js";
import { tarIn, tarOut } from "./tar.js";
import { vmSetup, vmSnapshotIn, vmSync } from "./vm.js";

export type { OpContext, OpHandler, OpHandlers } from "./context.js";

/** Every op the agent implements. */
export const BUILTIN_OPS: OpHandlers = {
  ping,
  info,
  exec,
  file_list: fileList,
  file_read: fileRead,
  file_write: fileWrite,
  patch_apply: patchApply,
  diff,
  tar_out: tarOut,
  tar_in: tarIn,
  vm_setup: vmSetup,
  vm_snapshot_in: vmSnapshotIn,
  vm_sync: vmSync,
  service_start: serviceStart,
  service_list: serviceList,
  service_status: serviceStatus,
  service_logs: serviceLogs,
  service_stop: serviceStop,
  shell_open: shellOpen,
  shell_write: shellWrite,
  shell_read: shellRead,
  shell_signal: shellSignal,
  shell_resize: shellResize,
  shell_close: shellClose,
  shell_list: shellList,
};
