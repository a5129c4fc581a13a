"""Escape attempts run inside a workspace (python3 of the debian:12 environment).

Usage: python3 probe.py '<json args>'; prints one JSON object {attempt: {escaped, detail}}.
`escaped` is true when the attempt got through the boundary; the host side of the suite
also checks host state itself (files, processes, listeners, logs, cgroups) after the run.
Every attempt is harmless when it succeeds: it writes values back unchanged, opens files
for writing without writing, creates sockets without connecting them anywhere off this
machine, and touches only paths made for the test.
"""
import ctypes
import errno
import json
import os
import socket
import stat
import sys

ARGS = json.loads(sys.argv[1])
R = {}
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def attempt(name):
    def deco(fn):
        try:
            escaped, detail = fn()
        except Exception as e:  # a refusal that raised is a refusal
            escaped, detail = False, f"{type(e).__name__}: {e}"
        R[name] = {"escaped": bool(escaped), "detail": str(detail)[:300]}
        return fn
    return deco


def errname(e=None):
    n = ctypes.get_errno() if e is None else e
    return errno.errorcode.get(n, str(n))


def open_for_write(path):
    """True if `path` opens for writing (nothing is written)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        # A path masked with /dev/null (Docker's MaskedPaths) opens, but writes go nowhere.
        st = os.fstat(fd)
        return not (stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3))
    finally:
        os.close(fd)


def write_same(path):
    try:
        with open(path) as f:
            value = f.read()
    except OSError as e:
        return False, f"unreadable: {e.strerror}"
    try:
        with open(path, "w") as f:
            f.write(value)
        return True, f"wrote {path}"
    except OSError as e:
        return False, e.strerror


def writable_under(root, skip=()):
    found = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if os.path.join(d, x) not in skip and not x.isdigit()]
        for f in files:
            p = os.path.join(d, f)
            if p in skip:
                continue
            if open_for_write(p):
                found.append(p)
                if len(found) > 20:
                    return found
    return found


def set_same_attrs(path, st):
    """chmod and utime of `path` to what `st` says it has (harmless if they work): which worked."""
    done = []
    for what, change in (
        ("chmod", lambda: os.chmod(path, stat.S_IMODE(st.st_mode))),
        ("utime", lambda: os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))),
    ):
        try:
            change()
            done.append(what)
        except OSError:
            pass
    return done


def raw_syscall(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return r, ctypes.get_errno()


def pids():
    return [p for p in os.listdir("/proc") if p.isdigit()]


def read_proc(pid, what):
    try:
        with open(f"/proc/{pid}/{what}", "rb") as f:
            return f.read()
    except OSError:
        return b""


# --- host-global kernel state --------------------------------------------------------

@attempt("sysctl kernel.core_pattern written")
def _():
    return write_same("/proc/sys/kernel/core_pattern")


@attempt("sysctl vm.swappiness written")
def _():
    return write_same("/proc/sys/vm/swappiness")


@attempt("any /proc/sys file opens for writing")
def _():
    found = writable_under("/proc/sys")
    return bool(found), found[:5] or "none"


@attempt("/proc/sysrq-trigger opens for writing")
def _():
    return open_for_write("/proc/sysrq-trigger"), "checked"


@attempt("a host-global /proc file opens for writing")
def _():
    skip = {"/proc/self", "/proc/thread-self", "/proc/sys"}
    found = writable_under("/proc", skip)
    return bool(found), found[:5] or "none"


@attempt("a /sys file opens for writing")
def _():
    found = writable_under("/sys") if os.path.isdir("/sys") else []
    return bool(found), found[:5] or "none"


@attempt("cgroup limits writable")
def _():
    found = [p for p in (
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        "/sys/fs/cgroup/pids/pids.max",
        "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/pids.max",
        "/sys/fs/cgroup/cgroup.procs",
    ) if open_for_write(p)]
    return bool(found), found or "none"


@attempt("kernel module loaded (finit_module reachable)")
def _():
    r, e = raw_syscall(313, -1, 0, 0)  # finit_module(bad fd): EBADF would mean it is reachable
    return e not in (errno.EPERM, errno.ENOSYS), errname(e)


@attempt("kexec_load reachable")
def _():
    r, e = raw_syscall(246, 0, 0, 0, 0)
    return e not in (errno.EPERM, errno.ENOSYS), errname(e)


@attempt("host kernel keyring reachable (add_key)")
def _():
    r, e = raw_syscall(248, ctypes.addressof(ctypes.create_string_buffer(b"user")),
                       ctypes.addressof(ctypes.create_string_buffer(b"pyro-escape")),
                       ctypes.addressof(ctypes.create_string_buffer(b"x")), 1, -3)
    return r >= 0, errname(e) if r < 0 else f"key {r}"


@attempt("host kernel keyring readable (keyctl)")
def _():
    r, e = raw_syscall(250, 0, -3, 0)  # KEYCTL_GET_KEYRING_ID, session keyring, no create
    return r >= 0, errname(e) if r < 0 else f"keyring {r}"


@attempt("kernel log readable (syslog)")
def _():
    buf = ctypes.create_string_buffer(4096)
    r = libc.klogctl(3, buf, 4096)
    return r > 0, errname() if r < 0 else f"{r} bytes"


@attempt("/dev/kmsg opens for writing")
def _():
    return open_for_write("/dev/kmsg"), "checked"


@attempt("host clock set (clock_settime)")
def _():
    class TS(ctypes.Structure):
        _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]
    now = TS()
    libc.clock_gettime(0, ctypes.byref(now))
    r = libc.clock_settime(0, ctypes.byref(now))  # set to the time it already is
    return r == 0, errname() if r != 0 else "set"


@attempt("bpf reachable")
def _():
    r, e = raw_syscall(321, 0, 0, 0)
    return e not in (errno.EPERM, errno.ENOSYS), errname(e)


@attempt("perf_event_open reachable")
def _():
    r, e = raw_syscall(298, 0, 0, -1, -1, 0)
    return e not in (errno.EPERM, errno.ENOSYS, errno.EACCES), errname(e)


@attempt("userfaultfd reachable")
def _():
    r, e = raw_syscall(323, 0)
    if r >= 0:
        os.close(r)
    return r >= 0, errname(e) if r < 0 else "fd"


@attempt("io_uring reachable")
def _():
    params = ctypes.create_string_buffer(120)
    r, e = raw_syscall(425, 1, ctypes.addressof(params))
    if r >= 0:
        os.close(r)
    return r >= 0, errname(e) if r < 0 else "fd"


@attempt("open_by_handle_at reachable (shocker)")
def _():
    r, e = raw_syscall(304, -1, 0, 0)
    return e not in (errno.EPERM, errno.ENOSYS), errname(e)


# --- namespaces, mounts, devices ------------------------------------------------------

@attempt("mount a tmpfs")
def _():
    r = libc.mount(b"none", b"/mnt", b"tmpfs", 0, None)
    return r == 0, errname() if r != 0 else "mounted"


@attempt("remount /proc/sys read-write")
def _():
    r = libc.mount(None, b"/proc/sys", None, 0x20 | 0x1000, None)  # MS_REMOUNT | MS_BIND
    return r == 0, errname() if r != 0 else "remounted"


@attempt("new user namespace")
def _():
    pid = os.fork()
    if pid == 0:
        os._exit(0 if libc.unshare(0x10000000) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0, "unshare(CLONE_NEWUSER)"


@attempt("new mount namespace")
def _():
    pid = os.fork()
    if pid == 0:
        os._exit(0 if libc.unshare(0x00020000) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0, "unshare(CLONE_NEWNS)"


@attempt("join the host's namespaces (setns)")
def _():
    fd = os.open("/proc/1/ns/mnt", os.O_RDONLY)
    try:
        r = libc.setns(fd, 0)
    finally:
        os.close(fd)
    return r == 0, errname() if r != 0 else "joined"


@attempt("chroot")
def _():
    pid = os.fork()
    if pid == 0:
        try:
            os.chroot("/tmp")
            os._exit(0)
        except OSError:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0, "chroot(/tmp)"


@attempt("mknod a memory device")
def _():
    try:
        os.mknod("/tmp/pyro-escape-mem", 0o600 | stat.S_IFCHR, os.makedev(1, 1))
    except OSError as e:
        return False, e.strerror
    os.unlink("/tmp/pyro-escape-mem")
    return True, "created /dev/mem's twin"


@attempt("a host device node's mode or times changed")
def _():
    # devtmpfs is one instance for the whole kernel: a node on it is the host's own inode.
    # Each attempt writes back what is there (same mode, same times): harmless if it works.
    fstype = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            fstype[left.split()[4]] = right.split()[0]
    changed, seen = [], []
    for name in ("null", "zero", "full", "random", "urandom", "tty"):
        p = "/dev/" + name
        if fstype.get(p, fstype.get("/dev")) != "devtmpfs" or not os.path.exists(p):
            continue
        seen.append(name)
        changed += [f"{what} {p}" for what in set_same_attrs(p, os.stat(p))]
    return bool(changed), changed or f"refused on host nodes {seen}" if seen else "no host device node"


@attempt("a host program's mode or times changed through /proc/PID/exe")
def _():
    # The binaries of the sandbox's processes that its own tree does not hold (the same
    # file is not at the link's path here): pid 1 is bwrap's, the host's file, in a bwrap
    # sandbox. Each attempt writes back what is there: harmless if it works.
    changed = []
    for pid in pids():
        p = f"/proc/{pid}/exe"
        try:
            st = os.stat(p)
        except OSError:
            continue
        try:
            here = os.stat(os.readlink(p))
            if (here.st_dev, here.st_ino) == (st.st_dev, st.st_ino):
                continue
        except OSError:
            pass
        changed += [f"{what} {os.readlink(p)} (pid {pid})" for what in set_same_attrs(p, st)]
    return bool(changed), changed or "refused"


@attempt("host devices present")
def _():
    bad = []
    for n in os.listdir("/dev"):
        p = os.path.join("/dev", n)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISBLK(st.st_mode) or n in ("kvm", "vsock", "mem", "kmem", "port", "vhost-vsock", "sda", "vda"):
            bad.append(n)
    return bool(bad), bad or "none"


@attempt("AF_VSOCK socket created")
def _():
    try:
        s = socket.socket(40, socket.SOCK_STREAM)
    except OSError as e:
        return False, e.strerror
    s.close()
    return True, "created (vsock is not network-namespaced)"


@attempt("raw packet socket created")
def _():
    try:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    except OSError as e:
        return False, e.strerror
    s.close()
    return True, "created"


@attempt("a network interface besides lo")
def _():
    names = [n for _, n in socket.if_nameindex()]
    return any(n != "lo" for n in names), names


# --- the host's processes, files, services and environment -----------------------------

@attempt("host process visible")
def _():
    marker = ARGS["host_marker_reversed"][::-1].encode()
    seen = [p for p in pids() if marker in read_proc(p, "cmdline")]
    return bool(seen), seen or "none"


@attempt("host process signalled")
def _():
    try:
        os.kill(ARGS["host_marker_pid"], 9)
    except ProcessLookupError:
        return False, "ESRCH"
    except PermissionError:
        return False, "EPERM"
    return True, "sent SIGKILL (the host checks the marker is alive)"


@attempt("host environment readable")
def _():
    needles = [v.encode() for v in ARGS["host_env_values"]]
    hits = []
    for p in pids() + ["self"]:
        env = read_proc(p, "environ")
        hits += [p for n in needles if n in env]
    return bool(hits), hits or "none"


@attempt("host file readable")
def _():
    secret = ARGS["host_canary_content"]
    for path in [ARGS["host_canary"]] + [f"/proc/{p}/root{ARGS['host_canary']}" for p in pids()]:
        try:
            with open(path) as f:
                if secret in f.read():
                    return True, path
        except OSError:
            pass
    return False, "not reachable"


@attempt("host file written")
def _():
    wrote = []
    for path in [ARGS["host_write_target"], f"/proc/1/root{ARGS['host_write_target']}"]:
        try:
            with open(path, "w") as f:
                f.write("escaped")
            wrote.append(path)
        except OSError:
            pass
    # Written inside the sandbox's own /tmp is fine; the host checks its own path.
    return False, wrote or "nothing"


@attempt("host's pyro state visible")
def _():
    found = [p for p in ARGS["host_paths"] if os.path.exists(p)]
    return bool(found), found or "none"


@attempt("another workspace's files visible")
def _():
    name = ARGS["other_marker"]
    hits = []
    for d, dirs, files in os.walk("/"):
        if d in ("/proc", "/sys", "/dev"):
            dirs[:] = []
            continue
        if name in files:
            hits.append(os.path.join(d, name))
    return bool(hits), hits or "none"


@attempt("another workspace's agent socket reachable")
def _():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(2)
    try:
        s.connect(ARGS["other_socket"])
    except OSError as e:
        return False, e.strerror or str(e)
    finally:
        s.close()
    return True, "connected"


@attempt("another workspace's secret readable")
def _():
    secret = ARGS["other_secret"].encode()
    hits = [p for p in pids() + ["self"] if secret in read_proc(p, "environ")]
    return bool(hits), hits or "none"


@attempt("host service on loopback reachable")
def _():
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", ARGS["host_port"]))
    except OSError as e:
        return False, e.strerror or str(e)
    finally:
        s.close()
    return True, "connected"


@attempt("host service on the host's own addresses reachable")
def _():
    got = []
    for ip in ARGS["host_ips"]:
        s = socket.socket()
        s.settimeout(2)
        try:
            s.connect((ip, ARGS["host_port"]))
            got.append(ip)
        except OSError:
            pass
        finally:
            s.close()
    return bool(got), got or "none"


@attempt("host log grown through inherited descriptors")
def _():
    chunk = b"x" * 65536
    wrote = 0
    for p in ("/proc/1/fd/1", "/proc/1/fd/2"):
        try:
            fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            for _ in range(16):
                wrote += os.write(fd, chunk)
        except OSError:
            pass
        finally:
            os.close(fd)
    # The host measures its log file; this only says how much was pushed.
    return False, f"pushed {wrote} bytes"


print(json.dumps(R))
