import { describe, expect, it } from "vitest";
import { hostTscKhz, kernelCmdline, tcgCmdline } from "../../../src/backends/vm/artifacts.js";

describe("kernelCmdline", () => {
  it("turns a guest panic into QEMU exiting: panic reboots, and the reboot is a triple fault (microvm has no other reset)", async () => {
    const args = kernelCmdline();
    expect(args).toContain("panic=-1");
    expect(args).toContain("reboot=t");
  });

  it("under TCG, skips TSC calibration with the host's rate (microvm hangs there otherwise); never under KVM", async () => {
    const khz = await hostTscKhz();
    expect(khz).toBeGreaterThan(100_000);
    expect(await tcgCmdline()).toEqual([`tsc_early_khz=${khz}`, "tsc=reliable"]);
    expect(kernelCmdline().some((a) => a.startsWith("tsc"))).toBe(false);
    expect(kernelCmdline()).toContain("rdinit=/init");
  });
});
