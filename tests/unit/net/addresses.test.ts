import { describe, expect, it } from "vitest";
import {
  type AddressKind,
  classifyAddress,
  isForbiddenAlways,
  isPrivateish,
} from "../../../src/net/addresses.js";

/** Pure classification: nothing here opens a socket. */
const CASES: [string, AddressKind][] = [
  ["8.8.8.8", "public"],
  ["1.1.1.1", "public"],
  ["2606:4700:4700::1111", "public"],
  ["127.0.0.1", "loopback"],
  ["127.255.255.254", "loopback"],
  ["::1", "loopback"],
  ["[::1]", "loopback"],
  ["10.0.0.1", "private"],
  ["10.255.255.255", "private"],
  ["172.16.0.1", "private"],
  ["172.31.255.254", "private"],
  ["172.32.0.1", "public"],
  ["192.168.1.1", "private"],
  ["fc00::1", "private"],
  ["fd12:3456::1", "private"],
  ["100.64.0.1", "cgnat"],
  ["100.127.255.254", "cgnat"],
  ["100.128.0.1", "public"],
  ["169.254.1.1", "link_local"],
  ["fe80::1", "link_local"],
  ["febf::1", "link_local"],
  ["169.254.169.254", "metadata"],
  ["169.254.170.2", "metadata"],
  ["100.100.100.200", "metadata"],
  ["fd00:ec2::254", "metadata"],
  ["0.0.0.0", "unspecified"],
  ["0.1.2.3", "unspecified"],
  ["::", "unspecified"],
  ["224.0.0.1", "multicast"],
  ["239.255.255.250", "multicast"],
  ["ff02::1", "multicast"],
  ["240.0.0.1", "reserved"],
  ["255.255.255.255", "reserved"],
  // Documentation nets count as public (see addresses.ts: CI machines use them for registries).
  ["192.0.2.1", "public"],
  ["203.0.113.80", "public"],
  ["::ffff:10.0.0.1", "private"],
  ["::ffff:127.0.0.1", "loopback"],
  ["::ffff:169.254.169.254", "metadata"],
  ["::ffff:8.8.8.8", "public"],
  ["::ffff:0:a00:1", "private"],
  ["64:ff9b::10.0.0.1", "private"],
  ["64:ff9b::7f00:1", "loopback"],
  ["64:ff9b::8.8.8.8", "public"],
  ["::10.0.0.1", "reserved"],
  ["2002:a00:1::1", "reserved"],
  ["2001:0:4136:e378::1", "reserved"],
  ["2001:db8::1", "public"],
  ["fec0::1", "reserved"],
  ["fe80::1%eth0", "reserved"],
  ["::127.0.0.1", "reserved"],
  ["not-an-ip", "reserved"],
  ["", "reserved"],
  ["0x7f.1", "reserved"],
];

describe("classifyAddress", () => {
  it.each(CASES)("classifies %s as %s", (ip, kind) => {
    expect(classifyAddress(ip)).toBe(kind);
  });
});

describe("isForbiddenAlways and isPrivateish", () => {
  it("split the kinds into never, only-if-trusted and public", () => {
    const never: AddressKind[] = [
      "loopback",
      "link_local",
      "metadata",
      "unspecified",
      "multicast",
      "reserved",
    ];
    for (const k of never) expect([isForbiddenAlways(k), isPrivateish(k)]).toEqual([true, false]);
    for (const k of ["private", "cgnat"] as const)
      expect([isForbiddenAlways(k), isPrivateish(k)]).toEqual([false, true]);
    expect([isForbiddenAlways("public"), isPrivateish("public")]).toEqual([false, false]);
  });
});
