/**
 * The one program a pool's hand-out (pool.ts) runs in a gVisor spare with a capability:
 * `runsc exec --cap CAP_SYS_ADMIN` of this static helper, which sets the hostname and
 * nothing else. Ours, built on the host with its `cc` (static: no loader, no library of
 * the environment's), bound read-only into every gVisor workspace sandbox. The
 * environment's own `hostname` is never run with a capability: an environment is not
 * trusted with one. Without it (no C compiler or static libc) a spare declines.
 */
import { buildStaticBinary } from "../vm/static-binary.js";

export { HOSTNAME_HELPER_IN_SANDBOX } from "./oci.js";

/** Takes exactly one argument: `pyro-` and 1-12 of [A-Za-z0-9-] (sandboxHostname's form). */
export const HOSTNAME_HELPER_SOURCE = `#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
  if (argc != 2) return 2;
  const char *n = argv[1];
  size_t len = strlen(n);
  if (len < 6 || len > 17 || strncmp(n, "pyro-", 5) != 0) return 2;
  for (size_t i = 5; i < len; i++) {
    char c = n[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-')) return 2;
  }
  return sethostname(n, len) == 0 ? 0 : 1;
}
`;

/** The helper's host path (built once per source), or null when it cannot be built here. */
export async function prepareHostnameHelper(cacheDir: string): Promise<string | null> {
  return (await buildStaticBinary(cacheDir, "pyro-gvisor-hostname", HOSTNAME_HELPER_SOURCE)).path;
}
