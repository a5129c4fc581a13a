import { buildStaticBinary, type StaticBuild } from "./static-binary.js";

/**
 * `pyro-reseed`, run in a guest restored from a template: every clone starts with the
 * template's RNG state, and a write to /dev/urandom only mixes bytes into the input pool
 * (the kernel's CRNG keeps its key until its next scheduled reseed, up to a minute away:
 * two clones were measured giving identical /dev/urandom output). This credits the host's
 * bytes (stdin) to the pool and forces the CRNG to reseed now (RNDADDENTROPY, then
 * RNDRESEEDCRNG; root in the guest).
 */
export const RESEED_SOURCE = String.raw`#include <fcntl.h>
#include <linux/random.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <unistd.h>

int main(void) {
  struct { int entropy_count; int buf_size; unsigned int buf[128]; } e;
  unsigned char *p = (unsigned char *)e.buf;
  size_t have = 0;
  while (have < sizeof e.buf) {
    ssize_t n = read(0, p + have, sizeof e.buf - have);
    if (n < 0) { perror("pyro-reseed: read"); return 1; }
    if (n == 0) break;
    have += (size_t)n;
  }
  if (have < 32) { fprintf(stderr, "pyro-reseed: need at least 32 bytes of entropy on stdin\n"); return 2; }
  e.entropy_count = (int)(have * 8);
  e.buf_size = (int)have;
  int fd = open("/dev/urandom", O_RDWR | O_CLOEXEC);
  if (fd < 0) { perror("pyro-reseed: /dev/urandom"); return 1; }
  if (ioctl(fd, RNDADDENTROPY, &e) < 0) { perror("pyro-reseed: RNDADDENTROPY"); return 1; }
  if (ioctl(fd, RNDRESEEDCRNG) < 0) { perror("pyro-reseed: RNDRESEEDCRNG"); return 1; }
  return 0;
}
`;

/** Builds pyro-reseed into `cacheDir` (once per source), or says why it cannot. */
export function prepareReseed(cacheDir: string, signal?: AbortSignal): Promise<StaticBuild> {
  return buildStaticBinary(cacheDir, "pyro-reseed", RESEED_SOURCE, signal ? { signal } : {});
}
