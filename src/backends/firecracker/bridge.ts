import { buildStaticBinary, type StaticBuild, staticBinaryName } from "../vm/static-binary.js";

/**
 * The guest half of the vsock channel: a tiny static C program that listens on a vsock
 * port and forwards every connection to the agent's unix socket, so the unmodified agent
 * (which only listens on a unix socket) is reachable from the host through Firecracker's
 * vsock device. It is compiled on the host with the host's `cc` (a Firecracker guest has
 * the host's architecture) and statically linked, so it runs on any guest root.
 *
 * The source lives here as a string because tsc does not copy .c files into dist/.
 */
export const VSOCK_BRIDGE_SOURCE = String.raw`/*
 * pyro-vsock-bridge: runs in a Firecracker guest. Listens on AF_VSOCK port PORT and,
 * for every accepted connection, connects to the unix socket PATH (the guest agent's)
 * and copies bytes both ways until both directions have ended.
 *
 *   pyro-vsock-bridge PORT PATH
 *   pyro-vsock-bridge --unix LISTEN_PATH PATH   (tests: hosts without vsock loopback)
 *
 * One child process per connection (the parent only accepts); children are reaped
 * automatically (SIGCHLD ignored). A relay uses non-blocking sockets, poll() and one
 * buffer per direction, so a peer that stops reading stalls only its own direction.
 * End of stream on one side becomes shutdown(SHUT_WR) on the other (half-close).
 * Exit codes: 2 bad usage, 1 cannot listen.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

#define BUF_SIZE 65536

struct pipe_dir {
  int from, to;
  char buf[BUF_SIZE];
  size_t len, off;
  int eof;  /* read side reached end of stream (or failed) */
  int done; /* eof and everything forwarded and the write side shut down */
};

static void usage(void) {
  fprintf(stderr, "usage: pyro-vsock-bridge PORT UNIX_SOCKET_PATH | --unix LISTEN_PATH UNIX_SOCKET_PATH\n");
  exit(2);
}

static int set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* The receiving side of p is gone: drop what is pending and stop this direction. */
static void sink_gone(struct pipe_dir *p) {
  p->len = 0;
  p->eof = 1;
  p->done = 1;
}

/* Moves what it can in one direction without blocking. */
static void pump(struct pipe_dir *p) {
  if (p->done) return;
  if (!p->eof && p->len == 0) {
    ssize_t n = read(p->from, p->buf, sizeof p->buf);
    if (n > 0) {
      p->len = (size_t)n;
      p->off = 0;
    } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      p->eof = 1;
    }
  }
  while (p->len > 0) {
    ssize_t n = write(p->to, p->buf + p->off, p->len);
    if (n > 0) {
      p->off += (size_t)n;
      p->len -= (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      return;
    } else {
      sink_gone(p);
      return;
    }
  }
  if (p->eof) {
    shutdown(p->to, SHUT_WR); /* half-close: the other side sees end of stream */
    p->done = 1;
  }
}

static void relay(int a, int b) {
  static struct pipe_dir up, down; /* one relay per process: static keeps 128 KiB off the stack */
  int hup_a = 0, hup_b = 0;
  memset(&up, 0, sizeof up);
  memset(&down, 0, sizeof down);
  up.from = a;
  up.to = b;
  down.from = b;
  down.to = a;
  if (set_nonblock(a) < 0 || set_nonblock(b) < 0) return;
  while (!(up.done && down.done)) {
    struct pollfd fds[2];
    memset(fds, 0, sizeof fds);
    if (!up.done && !up.eof && up.len == 0) fds[0].events |= POLLIN;
    if (!down.done && !down.eof && down.len == 0) fds[1].events |= POLLIN;
    if (!up.done && up.len > 0) fds[1].events |= POLLOUT;
    if (!down.done && down.len > 0) fds[0].events |= POLLOUT;
    /* poll() reports POLLHUP whether asked or not: leave out a hung-up socket we want
     * nothing from, or the loop would spin. */
    fds[0].fd = (hup_a && fds[0].events == 0) ? -1 : a;
    fds[1].fd = (hup_b && fds[1].events == 0) ? -1 : b;
    if (fds[0].fd < 0 && fds[1].fd < 0) return;
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    /* A hung-up (or failed) socket takes no more data; what it still holds can be read. */
    if (fds[0].revents & (POLLHUP | POLLERR)) {
      hup_a = 1;
      if (!down.done) sink_gone(&down);
    }
    if (fds[1].revents & (POLLHUP | POLLERR)) {
      hup_b = 1;
      if (!up.done) sink_gone(&up);
    }
    pump(&up);
    pump(&down);
  }
}

static int connect_unix(const char *path) {
  struct sockaddr_un sa;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, path, strlen(path));
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int listen_vsock(unsigned long port) {
  struct sockaddr_vm addr;
  int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    perror("pyro-vsock-bridge: socket(AF_VSOCK)");
    return -1;
  }
  memset(&addr, 0, sizeof addr);
  addr.svm_family = AF_VSOCK;
  addr.svm_cid = VMADDR_CID_ANY;
  addr.svm_port = (unsigned int)port;
  if (bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(fd, 64) < 0) {
    perror("pyro-vsock-bridge: bind/listen on vsock");
    close(fd);
    return -1;
  }
  return fd;
}

/* Binds a temporary name, listens, then renames it into place: once PATH exists, a
   connect to it succeeds (a bare bind would show the file before listen, and a client
   that waits for the file would get ECONNREFUSED). */
static int listen_unix(const char *path) {
  struct sockaddr_un sa;
  char tmp[sizeof sa.sun_path];
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (snprintf(tmp, sizeof tmp, "%s.t", path) >= (int)sizeof tmp) {
    fprintf(stderr, "pyro-vsock-bridge: listen path too long\n");
    close(fd);
    return -1;
  }
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, tmp, strlen(tmp));
  unlink(tmp);
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 64) < 0 || rename(tmp, path) < 0) {
    perror("pyro-vsock-bridge: bind/listen on unix socket");
    close(fd);
    return -1;
  }
  return fd;
}

static int path_ok(const char *path) {
  return path[0] != '\0' && strlen(path) < sizeof(((struct sockaddr_un *)0)->sun_path);
}

int main(int argc, char **argv) {
  const char *target;
  int lfd;

  if (argc == 4 && strcmp(argv[1], "--unix") == 0) {
    /* Test mode for hosts without vsock loopback: listen on a unix socket instead. */
    if (!path_ok(argv[2]) || !path_ok(argv[3])) usage();
    target = argv[3];
    lfd = listen_unix(argv[2]);
  } else if (argc == 3) {
    char *end = NULL;
    unsigned long port;
    errno = 0;
    port = strtoul(argv[1], &end, 10);
    if (argv[1][0] < '0' || argv[1][0] > '9' || errno != 0 || *end != '\0' || port == 0 || port > 0xffffffffUL)
      usage();
    if (!path_ok(argv[2])) usage();
    target = argv[2];
    lfd = listen_vsock(port);
  } else {
    usage();
  }
  if (lfd < 0) return 1;

  signal(SIGCHLD, SIG_IGN); /* children are reaped by the kernel: no zombies */
  signal(SIGPIPE, SIG_IGN); /* a write to a closed peer returns EPIPE instead of killing us */

  for (;;) {
    int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (cfd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      /* Out of descriptors or memory, or anything unexpected: back off, never spin. */
      perror("pyro-vsock-bridge: accept");
      usleep(100000);
      continue;
    }
    pid_t pid = fork();
    if (pid == 0) {
      int ufd;
      close(lfd);
      ufd = connect_unix(target);
      /* Agent not listening (yet): close; the host sees end of stream and retries. */
      if (ufd >= 0) {
        relay(cfd, ufd);
        close(ufd);
      }
      close(cfd);
      _exit(0);
    }
    if (pid < 0) perror("pyro-vsock-bridge: fork");
    close(cfd);
  }
}
`;

/** Compiler flags; part of the cache key. */
export type BridgeBuild = StaticBuild;

/** Cache file name of the bridge built from `source`: keyed by the source and the flags. */
export function bridgeFileName(source = VSOCK_BRIDGE_SOURCE): string {
  return staticBinaryName("pyro-vsock-bridge", source);
}

/**
 * Builds the bridge into `cacheDir` (once per source version) and returns its path, or
 * `null` with the reason when it cannot be built here (no C compiler, no static libc).
 */
export function prepareVsockBridge(
  cacheDir: string,
  options: { cc?: string; signal?: AbortSignal; source?: string } = {},
): Promise<BridgeBuild> {
  const { source, ...rest } = options;
  return buildStaticBinary(cacheDir, "pyro-vsock-bridge", source ?? VSOCK_BRIDGE_SOURCE, rest);
}

/** {@link prepareVsockBridge} as a path or `null`; the reason goes to `onUnavailable`. */
export async function buildVsockBridge(
  cacheDir: string,
  options: { cc?: string; signal?: AbortSignal; onUnavailable?: (reason: string) => void } = {},
): Promise<string | null> {
  const { onUnavailable, ...rest } = options;
  const r = await prepareVsockBridge(cacheDir, rest);
  if (r.path === null) onUnavailable?.(r.reason);
  return r.path;
}
