"""The pod role: the Zygote inside one lambda's gVisor sandbox, forking its spares.

It imports the lambda's packages, then forks spares on the worker's request, each of which
drops its privileges, connects on its own and becomes a handler; it can also become a
template, checkpointed and restored as new pods.

Loaded by the helper by path, as ``_sprout_pod`` (load.py); standard library only.
"""

import os
import signal
import sys
import traceback

import _sprout_load as load

channel = load.runtime_module("channel")
handler = load.runtime_module("handler")
zygote = load.runtime_module("zygote")

PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


def install_seccomp(libc, program):
    """Install the worker's seccomp filter (the bytes of its sock_filter array) on this
    process, as lean sandboxes hold it; gVisor's kernel runs it on every call."""
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    for args in ((PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0)):
        if libc.prctl(*(ctypes.c_ulong(a) for a in args)) != 0:
            raise OSError(ctypes.get_errno(), "installing the seccomp filter")


def serve_pod_spare(uid, gid, seccomp, held=None):
    """A spare forked in a pod: it drops to the handlers' user, becomes a subreaper, takes
    the seccomp filter, faults in a handler's pages, then connects to the worker on its own
    and says which process it is; the worker binds it to a sandbox with the init frame.
    A spare forked in a template (`held`: its pipes to the Zygote) says it is ready and waits
    to be let go before connecting: the template is checkpointed meanwhile, and the spare
    connects in the pod restored from it."""
    import ctypes

    handler.POD_HANDLER = True
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(ctypes.c_ulong(PR_SET_CHILD_SUBREAPER), ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if seccomp:
        install_seccomp(libc, bytes.fromhex(seccomp))
    zygote.prefault()
    if held:
        release, ready = held
        os.write(ready, b"r")
        os.close(ready)
        if os.read(release, 1) != b"g":
            return  # the Zygote went without letting it go
        os.close(release)
        if "random" in sys.modules:  # restored: every pod of the template had the same state
            sys.modules["random"].seed()
    try:
        sock = channel.connect()
    except OSError:
        return  # the pod is being parked: the worker no longer listens for spares
    channel.send_frame(sock, {"op": "spare", "pid": os.getpid()})
    handler.serve_lambda(sock)


def fork_spares(sock, order, held=None):
    """Fork the spares `order` asks for (at most 64); returns their pids."""
    pids = []
    for _ in range(max(0, min(int(order.get("count", 1)), 64))):
        pid = os.fork()
        if pid == 0:
            sock.close()
            try:
                serve_pod_spare(int(order["uid"]), int(order["gid"]), order.get("seccomp"), held)
            except BaseException:
                traceback.print_exc()  # to the pod's output: the lambda's log
            finally:
                os._exit(0)
        pids.append(pid)
    return pids


def become_template(sock, order):
    """Make this pod a template: fork the spares `order` asks for, held until they are let
    go, wait until they are ready, say so, and hang up (a host connection cannot be saved).
    The worker then checkpoints the pod. Each pod restored from it resumes here: the Zygote
    reaches the new pod's socket (tried every RECONNECT_PAUSE until it is there), says hello
    as a restored pod naming its spares, and lets them go, each to connect on its own.
    Returns the new pod's control socket."""
    release_r, release_w = os.pipe()
    ready_r, ready_w = os.pipe()
    pids = fork_spares(sock, order, (release_r, ready_w))
    os.close(release_r)
    os.close(ready_w)
    ready = 0
    while ready < len(pids):
        got = os.read(ready_r, 64)
        if not got:
            break  # a spare died before it was ready
        ready += len(got)
    os.close(ready_r)
    sys.stdout.flush()
    sys.stderr.flush()
    channel.send_frame(sock, {"pids": pids, "ready": ready})
    sock.close()
    sock = channel.reconnect()
    channel.send_frame(sock, {"op": "hello", "role": "pod", "restored": True, "spares": pids})
    os.write(release_w, b"g" * len(pids))
    os.close(release_w)
    return sock


def park(sock):
    """The worker parks this pod: its handlers have let go of their channels; the Zygote
    answers, hangs up (a host connection cannot be saved) and resumes in the pod restored
    from the checkpoint, saying hello there as a restored pod. Returns its new socket."""
    sys.stdout.flush()
    sys.stderr.flush()
    channel.send_frame(sock, {})
    sock.close()
    sock = channel.reconnect()
    channel.send_frame(sock, {"op": "hello", "role": "pod", "restored": True, "spares": []})
    return sock


def serve_pod():
    """The Zygote of a lambda's gVisor sandbox. It warms up, says hello, imports the lambda's
    packages when told (the import order and its hello are a package Zygote's), and then
    answers the worker's control frames, one reply each:

        {"op": "spares", "count": n, "uid": u, "gid": g}  fork n spares   -> {"pids": [...]}
        {"op": "status", "pids": [...]}     how those ended (an exit code, a negated signal,
                                            or null while one runs)       -> {"status": {...}}
        {"op": "kill", "pid": p}            SIGKILL one of its handlers   -> {}
        {"op": "template", "count": n, ...} become a template: fork n spares held until the
                                            pod is restored (become_template) -> {"pids": [...]}
        {"op": "park"}                      the pod is to be checkpointed: answer, hang up,
                                            and reconnect once restored (park)  -> {}
    """
    import gc

    zygote.warm_up()
    sock = channel.connect()
    channel.send_frame(sock, {"op": "hello", "role": "pod"})
    if not zygote.import_packages(sock):
        return
    import resource  # noqa: F401  (here once: a handler's memory limit needs it, and loading
    # a C extension inside gVisor costs a bound handler milliseconds)
    ended = {}

    def reap():
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            ended[pid] = os.waitstatus_to_exitcode(status)

    gc.collect()
    gc.freeze()  # what it imported stays out of the collector: its forks share those pages
    while True:
        try:
            order, _ = channel.recv_frame(sock)
        except (EOFError, OSError):
            return
        op = order.get("op")
        reap()
        if op == "spares":
            channel.send_frame(sock, {"pids": fork_spares(sock, order)})
        elif op == "template":
            sock = become_template(sock, order)
        elif op == "park":
            sock = park(sock)
        elif op == "status":
            reap()
            channel.send_frame(sock, {"status": {str(p): ended.pop(p, None) for p in order.get("pids") or []}})
        elif op == "kill":
            try:
                os.kill(int(order["pid"]), signal.SIGKILL)
            except (ProcessLookupError, ValueError, KeyError):
                pass
            channel.send_frame(sock, {})
        else:
            channel.send_frame(sock, {"error": f"unknown op {op!r}"})
