/**
 * The guest agent's command starter (`bin/pyro-spawn` in the agent's copy of the package,
 * agent-app.ts; the agent's side is src/agent/guest/spawner.ts). Node starts a child by
 * forking the whole agent (libuv's fork: ~1.7 ms of the agent blocked per command here,
 * more the more memory it holds); this small static program, started once by the agent,
 * starts each command with posix_spawn (a vfork: nothing copied), so a warm `exec true`
 * costs the agent a request line instead of a fork. Built on the host with its `cc`
 * (static: no loader or library of the environment's), like the gVisor hostname helper;
 * without a compiler the agent starts commands itself, as before.
 *
 * Protocol, on the helper's stdin and stdout (pipes from the agent):
 * - request: a 4-byte little-endian length, then NUL-terminated fields. `S`, id, cwd, the
 *   number of environment entries, the entries (`KEY=VALUE`), the command: starts
 *   `/bin/sh -c command` in cwd with exactly that environment, as the leader of a new
 *   session, every signal at its default and none blocked, stdin `/dev/null`, stdout and
 *   stderr two new pipes. `C`, fd, fd: closes the helper's ends of a command's pipes once
 *   the agent has opened them (through /proc/<helper>/fd: within the sandbox, where the
 *   commands already are).
 * - replies, lines: `S id pid outfd errfd` (started), `E id errno` (not started),
 *   `X pid status` (a command exited: its raw wait status; every child is reaped).
 * The helper exits when its stdin closes, and with the agent (PR_SET_PDEATHSIG).
 */
import { buildStaticBinary } from "./vm/static-binary.js";

export const SPAWN_HELPER_SOURCE = `#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_FRAME (8u << 20)
#define MAX_ENV 4096

static char *buf;
static size_t have, cap;
/*
 * The signals posix_spawn sets to their default in the child: all of them. glibc's
 * sigfillset leaves out its own two (32, 33), which its posix_spawn then sets to SIG_IGN
 * in the child, and the exec keeps that: they are put in by their bits (bit N-1 is
 * signal N; sigaddset refuses them too). A smaller set costs more, not less: glibc's
 * child asks the disposition of each signal outside it.
 */
static sigset_t to_default;

static void fill_to_default(void) {
  sigfillset(&to_default);
  unsigned long *w = (unsigned long *)&to_default;
  size_t bits = 8 * sizeof *w;
  for (int sig = 32; sig < SIGRTMIN; sig++) w[(size_t)(sig - 1) / bits] |= 1UL << ((size_t)(sig - 1) % bits);
}

/* The next NUL-terminated field of a frame, or NULL past its end. */
static char *field(char **at, char *end) {
  char *f = *at;
  if (f >= end) return NULL;
  char *nul = memchr(f, 0, (size_t)(end - f));
  if (!nul) return NULL;
  *at = nul + 1;
  return f;
}

static void start(char *at, char *end) {
  char *id = field(&at, end), *cwd = field(&at, end), *count = field(&at, end);
  if (!id || !cwd || !count) exit(3);
  long n = strtol(count, NULL, 10);
  if (n < 0 || n > MAX_ENV) exit(3);
  char **env = calloc((size_t)n + 1, sizeof *env);
  if (!env) exit(4);
  for (long i = 0; i < n; i++)
    if (!(env[i] = field(&at, end))) exit(3);
  char *cmd = field(&at, end);
  if (!cmd) exit(3);
  int o[2], e[2];
  if (pipe2(o, O_CLOEXEC) != 0) { dprintf(1, "E %s %d\\n", id, errno); free(env); return; }
  if (pipe2(e, O_CLOEXEC) != 0) { int err = errno; close(o[0]); close(o[1]); dprintf(1, "E %s %d\\n", id, err); free(env); return; }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, o[1], 1);
  posix_spawn_file_actions_adddup2(&fa, e[1], 2);
  posix_spawn_file_actions_addchdir_np(&fa, cwd);
  posix_spawnattr_t at2;
  posix_spawnattr_init(&at2);
  posix_spawnattr_setflags(&at2, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&at2, &none);
  posix_spawnattr_setsigdefault(&at2, &to_default);
  char *argv[] = {"/bin/sh", "-c", cmd, NULL};
  pid_t pid;
  int err = posix_spawn(&pid, "/bin/sh", &fa, &at2, argv, env);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at2);
  close(o[1]);
  close(e[1]);
  free(env);
  if (err) {
    close(o[0]);
    close(e[0]);
    dprintf(1, "E %s %d\\n", id, err);
  } else {
    dprintf(1, "S %s %d %d %d\\n", id, (int)pid, o[0], e[0]);
  }
}

static void frame(char *p, uint32_t len) {
  char *end = p + len, *at = p;
  char *kind = field(&at, end);
  if (!kind) exit(3);
  if (strcmp(kind, "S") == 0) {
    start(at, end);
  } else if (strcmp(kind, "C") == 0) {
    char *f;
    while ((f = field(&at, end))) {
      long fd = strtol(f, NULL, 10);
      if (fd > 2) close((int)fd);
    }
  } else {
    exit(3);
  }
}

int main(void) {
  /* With the agent: a parent gone before this line leaves stdin at EOF, which ends it too. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  signal(SIGPIPE, SIG_IGN);
  fill_to_default();
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) return 4;
  cap = 65536;
  buf = malloc(cap);
  if (!buf) return 4;
  struct pollfd p[2] = {{0, POLLIN, 0}, {sfd, POLLIN, 0}};
  for (;;) {
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return 4;
    }
    if (p[1].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) > 0) {}
      int st;
      pid_t w;
      while ((w = waitpid(-1, &st, WNOHANG)) > 0) dprintf(1, "X %d %d\\n", (int)w, st);
    }
    if (p[0].revents) {
      if (have == cap) {
        if (cap >= MAX_FRAME + 4) return 3;
        cap *= 2;
        char *grown = realloc(buf, cap);
        if (!grown) return 4;
        buf = grown;
      }
      ssize_t n = read(0, buf + have, cap - have);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return 0;
      have += (size_t)n;
      for (;;) {
        if (have < 4) break;
        uint32_t len;
        memcpy(&len, buf, 4);
        if (len > MAX_FRAME) return 3;
        if (have < 4 + (size_t)len) {
          while (cap < 4 + (size_t)len) {
            cap *= 2;
            char *grown = realloc(buf, cap);
            if (!grown) return 4;
            buf = grown;
          }
          break;
        }
        frame(buf + 4, len);
        memmove(buf, buf + 4 + len, have - 4 - len);
        have -= 4 + len;
      }
    }
  }
}
`;

/** The helper's host path (built once per source), or null when it cannot be built here. */
export async function prepareSpawnHelper(cacheDir: string): Promise<string | null> {
  return (await buildStaticBinary(cacheDir, "pyro-spawn", SPAWN_HELPER_SOURCE)).path;
}
