import { buildStaticBinary, type StaticBuild } from "./static-binary.js";
import { SETUP_HELPER } from "./types.js";

/**
 * `pyro-vmsetup`: everything a VM must do after every start before it takes work (root in
 * the guest), for the agent's vm_setup. Under emulation (TCG) every process start and
 * every Node file operation right after a restore costs tens of milliseconds (QEMU
 * translates each code path anew): the busybox shell this replaces (6 processes and a
 * dozen Node file operations) was most of a reset's time beyond the restore itself, and
 * a process spawned by the agent still cost 0.3-0.8 s. So stage 2 starts it as a server
 * before the template is saved (`--serve`), and a clone's agent only makes one unix
 * socket round trip; `--once` is the same work as a process of its own (the agent's
 * fallback while the server is not there).
 *
 *   pyro-vmsetup --serve SOCKET SEED_SERIAL SEED_DIR UPPER WORK WORKSPACE [PORT]
 *     request (one line): HOSTNAME UNIX_MS ENTROPY_HEX [nomount]; reply: "ok mounted=0|1" or "error ..."
 *     on SOCKET (the agent's vm_setup) and, with PORT, on the virtio-serial port of that
 *     name: the qemu backend's own channel to it (SETUP_PORT_NAME), which spares a
 *     restored clone the agent's request path (Node code each clone translates anew) and
 *     runs while the agent answers its handshake
 *   pyro-vmsetup --once SEED_SERIAL SEED_DIR UPPER WORK WORKSPACE HOSTNAME UNIX_MS ENTROPY_HEX [nomount]
 *     prints the reply; exit status 0 only for "ok"
 *
 * The work:
 * - sets the hostname and the clock (a clone carries the template's);
 * - credits the host's entropy to the kernel pool and forces the CRNG to reseed now
 *   (RNDADDENTROPY, RNDRESEEDCRNG): a plain write to /dev/urandom leaves the template's
 *   CRNG key in use until the kernel's next scheduled reseed, up to a minute away (two
 *   clones were measured giving identical /dev/urandom output);
 * - unless WORKSPACE is mounted already (`nomount`: only the first two steps of this,
 *   for the template): makes the mount points, finds the seed disk by its virtio serial (or
 *   `pyro.disks=seed:DEV` on the kernel command line), drops the block cache the
 *   template's kernel kept of it (it read a blank placeholder's first blocks), mounts it
 *   read-only at SEED_DIR and mounts WORKSPACE as an overlay of it under UPPER/WORK.
 */
export const SETUP_HELPER_SOURCE = String.raw`#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/random.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

struct layout { const char *serial, *seed_dir, *upper, *work, *ws; };
static char err[1024];

static int fail(const char *fmt, ...) {
  int e = errno;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(err, sizeof err, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof err && e) snprintf(err + n, sizeof err - n, ": %s", strerror(e));
  return -1;
}

/* 1 when p is a mount point (field 5 of /proc/self/mountinfo; our paths have no spaces). */
static int mounted(const char *p) {
  FILE *f = fopen("/proc/self/mountinfo", "re");
  if (!f) return fail("open /proc/self/mountinfo");
  char *line = NULL;
  size_t cap = 0, n = strlen(p);
  int found = 0;
  while (!found && getline(&line, &cap, f) > 0) {
    char *s = line;
    for (int i = 0; i < 4 && s; i++) if ((s = strchr(s, ' '))) s++;
    if (s && strncmp(s, p, n) == 0 && s[n] == ' ') found = 1;
  }
  free(line);
  fclose(f);
  return found;
}

static int mkdirs(const char *path) {
  char p[4096];
  if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) { errno = ENAMETOOLONG; return fail("mkdir %s", path); }
  for (char *s = p + 1;; s++) {
    if (*s && *s != '/') continue;
    char c = *s;
    *s = 0;
    if (mkdir(p, 0755) < 0 && errno != EEXIST) return fail("mkdir %s", p);
    if (!c) return 0;
    *s = c;
  }
}

static int read_small(const char *path, char *buf, size_t size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, size - 1);
  close(fd);
  if (n < 0) return -1;
  buf[n] = 0;
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) buf[--n] = 0;
  return 0;
}

/* /dev/<disk> of the seed disk: pyro.disks=seed:DEV on the command line, else by virtio serial. */
static int seed_device(const char *serial, char *out, size_t size) {
  char cmdline[4096];
  if (read_small("/proc/cmdline", cmdline, sizeof cmdline) == 0) {
    char *m = strstr(cmdline, "pyro.disks=");
    if (m && (m == cmdline || m[-1] == ' ')) {
      char *value = m + 11, *save = NULL;
      value[strcspn(value, " ")] = 0;
      for (char *pair = strtok_r(value, ",", &save); pair; pair = strtok_r(NULL, ",", &save))
        if (strncmp(pair, "seed:", 5) == 0 && pair[5]) { snprintf(out, size, "/dev/%s", pair + 5); return 0; }
    }
  }
  DIR *d = opendir("/sys/block");
  if (!d) return fail("open /sys/block");
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, "vd", 2) != 0) continue;
    char path[512], s[256];
    snprintf(path, sizeof path, "/sys/block/%s/serial", e->d_name);
    if (read_small(path, s, sizeof s) == 0 && strcmp(s, serial) == 0) {
      snprintf(out, size, "/dev/%s", e->d_name);
      closedir(d);
      return 0;
    }
  }
  closedir(d);
  errno = 0;
  return fail("no seed disk (virtio serial %s) in this VM", serial);
}

static int reseed(const unsigned char *bytes, size_t have) {
  struct { int entropy_count; int buf_size; unsigned int buf[128]; } e;
  if (have < 32 || have > sizeof e.buf) { errno = 0; return fail("need 32-512 bytes of entropy, got %zu", have); }
  memcpy(e.buf, bytes, have);
  e.entropy_count = (int)(have * 8);
  e.buf_size = (int)have;
  int fd = open("/dev/urandom", O_RDWR | O_CLOEXEC);
  if (fd < 0) return fail("open /dev/urandom");
  int r = ioctl(fd, RNDADDENTROPY, &e) < 0 ? fail("RNDADDENTROPY") : ioctl(fd, RNDRESEEDCRNG) < 0 ? fail("RNDRESEEDCRNG") : 0;
  close(fd);
  return r;
}

/*
 * The mount points and the seed disk's device, found once per server: the template's
 * "nomount" request does it before the save, so a restored clone (same disks, a copy of
 * the template's state disk) skips those first-time lookups, each slow under emulation.
 */
static char seed_dev[300];

static int prepare(const struct layout *l) {
  if (seed_dev[0]) return 0;
  if (mkdirs(l->upper) < 0 || mkdirs(l->work) < 0 || mkdirs(l->ws) < 0 || mkdirs(l->seed_dir) < 0) return -1;
  return seed_device(l->serial, seed_dev, sizeof seed_dev);
}

/*
 * Whether SEED_DIR and WORKSPACE are mount points, as far as this server knows: -1 not
 * known (read /proc/self/mountinfo), else what it saw or did itself. The template's
 * "nomount" request reads them before the save, and only this server mounts them, so a
 * restored clone skips both reads (the first mountinfo of a clone cost 30-60 ms under
 * TCG); a server started anew (a cold boot, a restart) knows nothing.
 */
static int seed_known = -1, ws_known = -1;

static int is_mounted(const char *p, int known) { return known >= 0 ? known : mounted(p); }

static int mount_workspace(const struct layout *l) {
  if (prepare(l) < 0) return -1;
  int m = is_mounted(l->seed_dir, seed_known);
  if (m < 0) return -1;
  if (!m) {
    const char *dev = seed_dev;
    int fd = open(dev, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail("open %s", dev);
    int r = ioctl(fd, BLKFLSBUF, 0);
    close(fd);
    if (r < 0) return fail("BLKFLSBUF %s", dev);
    if (mount(dev, l->seed_dir, "ext4", MS_RDONLY, "noload") < 0) return fail("mount %s", dev);
  }
  seed_known = 1;
  char opts[8192];
  if (snprintf(opts, sizeof opts, "lowerdir=%s,upperdir=%s,workdir=%s", l->seed_dir, l->upper, l->work) >= (int)sizeof opts) {
    errno = ENAMETOOLONG;
    return fail("overlay options for %s", l->ws);
  }
  if (mount("overlay", l->ws, "overlay", 0, opts) < 0) return fail("mount overlay on %s", l->ws);
  ws_known = 1;
  return 0;
}

static int unhex(const char *hex, unsigned char *out, size_t max) {
  size_t n = strlen(hex);
  if (n % 2 || n / 2 > max) return -1;
  for (size_t i = 0; i < n / 2; i++) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -1;
    out[i] = (unsigned char)v;
  }
  return (int)(n / 2);
}

/* One request: "HOSTNAME UNIX_MS ENTROPY_HEX [nomount]"; the reply line into out. */
static void setup(const struct layout *l, char *request, char *out, size_t size) {
  char *save = NULL;
  char *host = strtok_r(request, " \n", &save), *ms_s = strtok_r(NULL, " \n", &save), *hex = strtok_r(NULL, " \n", &save);
  char *flag = strtok_r(NULL, " \n", &save);
  int mount_it = !(flag && strcmp(flag, "nomount") == 0);
  unsigned char entropy[512];
  int n = hex ? unhex(hex, entropy, sizeof entropy) : -1;
  errno = 0;
  if (!host || !ms_s || n < 0) { fail("malformed request"); goto out; }
  if (sethostname(host, strlen(host)) < 0) { fail("sethostname %s", host); goto out; }
  long long ms = atoll(ms_s);
  struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };
  if (clock_settime(CLOCK_REALTIME, &ts) < 0) { fail("clock_settime %s", ms_s); goto out; }
  if (reseed(entropy, (size_t)n) < 0) goto out;
  if (!mount_it) {
    if (prepare(l) < 0 || (seed_known = mounted(l->seed_dir)) < 0 || (ws_known = mounted(l->ws)) < 0) goto out;
  }
  int m = mount_it ? is_mounted(l->ws, ws_known) : 1;
  if (m < 0 || (!m && mount_workspace(l) < 0)) goto out;
  snprintf(out, size, "ok mounted=%d\n", !m);
  return;
out:
  snprintf(out, size, "error %s\n", err);
}

/* One client of the unix socket (the agent's vm_setup): one request line, one reply. */
static void serve_client(int s, const struct layout *l) {
  int c = accept4(s, NULL, NULL, SOCK_CLOEXEC);
  if (c < 0) return;
  /* A client that never finishes its line does not hold the server for ever. */
  struct timeval tv = { .tv_sec = 10 };
  setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char req[2048], reply[1200];
  size_t have = 0;
  while (have < sizeof req - 1 && !memchr(req, '\n', have)) {
    ssize_t n = read(c, req + have, sizeof req - 1 - have);
    if (n <= 0) break;
    have += (size_t)n;
  }
  req[have] = 0;
  if (memchr(req, '\n', have)) {
    setup(l, req, reply, sizeof reply);
    if (write(c, reply, strlen(reply)) < 0) { /* the client went away */ }
  }
  close(c);
}

/*
 * The host's own port (virtio-serial, named PORT): the qemu backend sends a restored
 * clone's request here itself, while the agent answers its handshake, so no Node code
 * runs for it. While no host is connected the port reads as EOF and polls as readable
 * and hung up, so it is polled only while a host is there; the kernel's SIGIO (O_ASYNC)
 * says when one connects or sends.
 *
 * The driver (virtio_console) learns that a host connected from a control message it
 * handles later, in a workqueue, but the host's data is readable as soon as it arrives:
 * a request can be read and answered while the port still says no host is there, and
 * the write fails (EAGAIN). Such a reply is kept, never dropped (the host waits for it),
 * and written once the host shows up (SIGIO, or the look every second); nor is a partial
 * line dropped at EOF (as likely a host not seen yet as one gone). The host sends one
 * request per VM start and ends the VM when it gets no answer: no earlier host's
 * leftovers can reach a later one.
 */
struct port { int fd, host; size_t have, out_len; char buf[2048], out[1200]; };

static void open_port(struct port *p, const char *name) {
  DIR *d = opendir("/sys/class/virtio-ports");
  struct dirent *e;
  while (d && p->fd < 0 && (e = readdir(d))) {
    char path[512], s[256];
    snprintf(path, sizeof path, "/sys/class/virtio-ports/%s/name", e->d_name);
    if (e->d_name[0] == '.' || read_small(path, s, sizeof s) < 0 || strcmp(s, name) != 0) continue;
    snprintf(path, sizeof path, "/dev/%s", e->d_name);
    p->fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (p->fd >= 0 && (fcntl(p->fd, F_SETOWN, getpid()) < 0 || fcntl(p->fd, F_SETFL, O_NONBLOCK | O_ASYNC) < 0)) {
      close(p->fd);
      p->fd = -1;
    }
  }
  if (d) closedir(d);
}

/* Writes the kept reply: 1 when it is gone (sent, or the port failed), 0 when the port cannot take it yet. */
static int port_flush(struct port *p) {
  if (!p->out_len) return 1;
  ssize_t n = write(p->fd, p->out, p->out_len);
  if (n < 0 && errno == EAGAIN) return 0;
  if (n > 0 && (size_t)n < p->out_len) {
    memmove(p->out, p->out + n, p->out_len - (size_t)n);
    p->out_len -= (size_t)n;
    return 0;
  }
  p->out_len = 0;
  return 1;
}

/* Whether the port says a host is connected (it polls as hung up while none is). */
static int port_host(int fd) {
  struct pollfd q = { .fd = fd, .events = POLLIN | POLLOUT };
  return poll(&q, 1, 0) == 1 && !(q.revents & (POLLHUP | POLLERR | POLLNVAL));
}

/* Sends the kept reply (until it is sent, nothing more is read), reads and answers a request line, notes whether a host is there. */
static void port_work(struct port *p, const struct layout *l) {
  for (;;) {
    if (!port_flush(p)) {
      p->host = port_host(p->fd);
      return;
    }
    if (p->have >= sizeof p->buf - 1) p->have = 0; /* an overlong line is dropped */
    ssize_t n = read(p->fd, p->buf + p->have, sizeof p->buf - 1 - p->have);
    if (n <= 0) {
      p->host = n < 0 && errno == EAGAIN; /* EAGAIN: connected, nothing yet; 0: nobody (yet) */
      return;
    }
    p->have += (size_t)n;
    p->buf[p->have] = 0;
    if (!memchr(p->buf, '\n', p->have)) continue;
    setup(l, p->buf, p->out, sizeof p->out);
    p->out_len = strlen(p->out);
    p->have = 0; /* one request per line read */
  }
}

static void on_sigio(int sig) { (void)sig; }

static int serve(const char *path, const char *port_name, const struct layout *l) {
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = { .sun_family = AF_UNIX };
  if (s < 0 || strlen(path) >= sizeof a.sun_path) { perror("pyro-vmsetup: socket"); return 1; }
  strcpy(a.sun_path, path);
  unlink(path);
  /* The socket root's only; the mount points it makes later get the usual 0755. */
  mode_t old = umask(077);
  int bound = bind(s, (struct sockaddr *)&a, sizeof a);
  umask(old);
  if (bound < 0 || listen(s, 4) < 0) { perror("pyro-vmsetup: bind"); return 1; }
  /* SIGIO is blocked except inside ppoll: one sent between a read and the wait is not lost. */
  sigset_t io, waiting;
  sigemptyset(&io);
  sigaddset(&io, SIGIO);
  sigprocmask(SIG_BLOCK, &io, &waiting);
  sigdelset(&waiting, SIGIO);
  struct sigaction sa = { .sa_handler = on_sigio };
  sigaction(SIGIO, &sa, NULL);
  struct port p = { .fd = -1 };
  for (;;) {
    if (port_name && p.fd < 0) open_port(&p, port_name);
    if (p.fd >= 0) port_work(&p, l);
    short port_events = p.out_len ? POLLOUT : POLLIN;
    struct pollfd fds[2] = { { .fd = s, .events = POLLIN }, { .fd = p.fd, .events = port_events } };
    /* Without a host on the port: SIGIO, or a look every second (the port not found yet, a lost signal, a kept reply). */
    struct timespec second = { .tv_sec = 1 };
    int n = ppoll(fds, p.host ? 2 : 1, port_name && !p.host ? &second : NULL, &waiting);
    if (n > 0 && (fds[0].revents & POLLIN)) serve_client(s, l);
  }
}

int main(int argc, char **argv) {
  if ((argc == 8 || argc == 9) && strcmp(argv[1], "--serve") == 0) {
    struct layout l = { argv[3], argv[4], argv[5], argv[6], argv[7] };
    return serve(argv[2], argc == 9 ? argv[8] : NULL, &l);
  }
  if ((argc == 10 || argc == 11) && strcmp(argv[1], "--once") == 0) {
    struct layout l = { argv[2], argv[3], argv[4], argv[5], argv[6] };
    char req[2048], reply[1200];
    if (snprintf(req, sizeof req, "%s %s %s %s\n", argv[7], argv[8], argv[9], argc == 11 ? argv[10] : "") >= (int)sizeof req) return 2;
    setup(&l, req, reply, sizeof reply);
    fputs(reply, stdout);
    return strncmp(reply, "ok ", 3) == 0 ? 0 : 1;
  }
  fprintf(stderr, "usage: pyro-vmsetup --serve SOCKET SEED_SERIAL SEED_DIR UPPER WORK WORKSPACE [PORT]\n"
                  "       pyro-vmsetup --once SEED_SERIAL SEED_DIR UPPER WORK WORKSPACE HOSTNAME UNIX_MS ENTROPY_HEX\n");
  return 2;
}
`;

/** Builds pyro-vmsetup into `cacheDir` (once per source), or says why it cannot. */
export function prepareSetupHelper(cacheDir: string, signal?: AbortSignal): Promise<StaticBuild> {
  return buildStaticBinary(cacheDir, SETUP_HELPER, SETUP_HELPER_SOURCE, signal ? { signal } : {});
}
