/**
 * The guest agent's command starter (`bin/pyro-spawn` in the agent's copy of the package,
 * agent-app.ts; the agent's side is src/agent/guest/spawner.ts). Node starts a child by
 * forking the whole agent (libuv's fork: ~1.7 ms of the agent blocked per command here,
 * more the more memory it holds); this small static program, started once by the agent,
 * starts each command with a clone that shares its memory until the exec (as glibc's
 * posix_spawn does: nothing copied), so a warm `exec true` costs the agent a request line
 * instead of a fork. Built on the host with its `cc`
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
 *   `X pid status` (a command exited: its raw wait status; every child is reaped), and
 *   first of all `R 1` when the helper is its commands' subreaper (PR_SET_CHILD_SUBREAPER),
 *   `R 0` when the kernel refused.
 * The helper exits when its stdin closes, and with the agent (PR_SET_PDEATHSIG). Its one
 * argument, when given, is the nice value of its commands: each is lowered between its
 * clone and its exec, so it runs at that value from its first instruction, while the
 * helper stays at the agent's own (it is also the reaper of their orphans, below: at the
 * commands' priority it reaped a fork bomb's hundreds of zombies too slowly under load,
 * and zombies count against the sandbox's pids limit).
 *
 * As subreaper the helper gets every orphan of its commands (a background job whose shell
 * exited, a double fork), so while it lives every process of a command's session is a
 * descendant of the helper: once a command's exit is reported, a helper whose only
 * children are commands still running has nothing of it left anywhere, and the agent can
 * skip the /proc scan of its hangup (Spawner.mayHaveLeftovers).
 */
import { buildStaticBinary } from "./vm/static-binary.js";

export const SPAWN_HELPER_SOURCE = `#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_FRAME (8u << 20)
#define MAX_ENV 4096

static char *buf;
static size_t have, cap;
/* The nice value of commands (the helper's argument), 0 to leave them at the helper's. */
static int command_nice;

/*
 * glibc's own signals (32, 33) to their default in the helper, which never uses what
 * they serve (it has one thread): then no signal of the helper has a handler, so none
 * can run in a command's child before its exec, where it would share the helper's
 * memory. (glibc's posix_spawn, used before, set these two to SIG_IGN in the child,
 * which the exec kept: every command had them ignored.) Raw calls: glibc refuses them.
 */
static void default_glibc_signals(void) {
  struct { void *handler; unsigned long flags; void *restorer; unsigned long mask; } dfl = { SIG_DFL, 0, NULL, 0 };
  for (int sig = 32; sig < SIGRTMIN; sig++) syscall(SYS_rt_sigaction, sig, &dfl, NULL, sizeof dfl.mask);
}

/* What a command's child needs, and what it reports when it cannot exec. */
struct child_args { const char *cwd; char **env; char *cmd; int out, err; volatile int failed; };
static char child_stack[64 * 1024] __attribute__((aligned(16)));

/*
 * A command's child, on its own stack, in the helper's memory until the exec (the helper
 * waits): system calls only. A new session, the commands' nice value, SIGPIPE back to
 * its default (the helper ignores it; no other signal is changed or caught), nothing
 * blocked, stdin /dev/null and the two pipes, the cwd, then /bin/sh -c.
 */
static int command_main(void *p) {
  struct child_args *a = p;
  struct sigaction dfl = { .sa_handler = SIG_DFL };
  sigset_t none;
  sigemptyset(&none);
  int null;
  if (setsid() < 0 || (command_nice != 0 && setpriority(PRIO_PROCESS, 0, command_nice) != 0) ||
      sigaction(SIGPIPE, &dfl, NULL) != 0 || sigprocmask(SIG_SETMASK, &none, NULL) != 0 ||
      (null = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0 || dup2(null, 0) < 0 || dup2(a->out, 1) < 0 ||
      dup2(a->err, 2) < 0 || chdir(a->cwd) != 0) {
    a->failed = errno ? errno : EINVAL;
    _exit(127);
  }
  char *argv[] = {"/bin/sh", "-c", a->cmd, NULL};
  execve("/bin/sh", argv, a->env);
  a->failed = errno ? errno : ENOEXEC;
  _exit(127);
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
  struct child_args a = { cwd, env, cmd, o[1], e[1], 0 };
  pid_t pid = clone(command_main, child_stack + sizeof child_stack, CLONE_VM | CLONE_VFORK | SIGCHLD, &a);
  int err = pid < 0 ? errno : a.failed;
  /* A child that could not exec has exited: reaped here, so no X line names it. */
  if (pid > 0 && err) while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
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

int main(int argc, char **argv) {
  if (argc > 2) return 2;
  if (argc == 2) command_nice = atoi(argv[1]);
  /* With the agent: a parent gone before this line leaves stdin at EOF, which ends it too. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  dprintf(1, "R %d\\n", prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
  signal(SIGPIPE, SIG_IGN);
  default_glibc_signals();
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
