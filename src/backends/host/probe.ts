import type { BackendProbe } from "../backend.js";

/** The host backend always works and never isolates: only with --allow-host-compat. */
export const hostProbe: BackendProbe = {
  name: "host",
  isolation: "none (runs directly on the host)",
  async probe() {
    return {
      available: true,
      version: process.version,
      reason: "no isolation: used only with --allow-host-compat",
      opt_in: true,
      details: {},
    };
  },
};
