"""The handler role: serve one lambda's requests, ending what each request left running.

Over the worker's channel a handler receives its init frame, loads the lambda and says
hello, then answers each request frame with one reply frame until the worker hangs up; a
pod's handler may be parked between requests (``park``).

Loaded by the helper by path, as ``_sprout_handler`` (load.py); standard library only.
"""

import os
import signal
import sys

import _sprout_load as load

channel = load.runtime_module("channel")
dispatch = load.runtime_module("dispatch")

LEARN_REQUESTS = 3  # requests after which a handler reports modules they loaded lazily
LOG_FORMAT = "[%(levelname)s] %(name)s: %(message)s"


def configure_logging():
    """Send Python's logging to stderr, one `[LEVEL] logger: message` line a record (the
    worker keeps them with the request's other output), at $SPROUT_LOG_LEVEL (default INFO).
    Only once the lambda has imported logging (importing it here would cost every sandbox
    several milliseconds), and only if the lambda configured no handler of its own. Returns
    whether logging is settled (configured, by us or by the lambda)."""
    logging = sys.modules.get("logging")
    if logging is None:
        return False
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
        level = os.environ.get("SPROUT_LOG_LEVEL", "INFO").upper()
        root.setLevel(level if level in logging._nameToLevel else "INFO")
    return True


def serve_lambda(sock):
    """Serve one lambda over the worker's channel `sock`: its init frame, its load and hello,
    then one reply frame for each request frame until the worker hangs up."""
    try:
        init, _ = channel.recv_frame(sock)
    except EOFError:
        return
    load.apply_init(init)
    calls, sandbox = channel.install_calls(sock)
    modules_before = len(sys.modules)
    server = None
    try:
        kind, entry = load.load_lambda()
        if kind == "asgi":
            server = load.runtime_module("asgi").Server(entry)
            server.startup()  # lifespan: once per sandbox, after the fork
    except BaseException as exc:
        channel.send_frame(sock, {"op": "hello", "error": "load_error",
                                  "message": f"{type(exc).__name__}: {exc}",
                                  "traceback": dispatch.short_traceback(exc)})
        return
    logging_settled = configure_logging()
    channel.send_frame(sock, {"op": "hello", "kind": kind, "package_modules": load.package_modules(modules_before)})
    invoke = {"wsgi": dispatch.invoke_wsgi, "function": dispatch.invoke_function}.get(kind)
    if server is not None:
        def invoke(_app, request, body):
            return server.invoke(request, body)
    invoke_many = dispatch.invoke_batch if kind == "function" else dispatch.refuse_batch(kind)
    init = os.getpid() == 1  # PID 1 of the sandbox's namespace (a pod's handler is not)
    served = 0
    while True:
        try:
            request, body = channel.recv_frame(sock)
        except EOFError:
            if server is not None:
                server.shutdown()
            return
        if request.get("op") == "park":
            sock = park(sock)
            calls.sock = sock
            continue
        modules_before = len(sys.modules)
        if not logging_settled:
            logging_settled = configure_logging()
        sandbox.request_id = request.get("request_id", "")
        calls.serving = True
        try:
            header, out = (invoke_many if request.get("batch") else invoke)(entry, request, body)
        finally:
            with calls.lock:  # a call still under way in another thread finishes first
                calls.serving = False
            sandbox.request_id = ""
        served += 1
        if served <= LEARN_REQUESTS and len(sys.modules) > modules_before:
            # Packages often import parts of themselves on first use (Pillow's file formats).
            learned = load.package_modules(modules_before)
            if learned:
                header["package_modules"] = learned
        sys.stdout.flush()
        sys.stderr.flush()
        kill_leftovers(init)
        channel.send_frame(sock, header, out)


def park(sock):
    """The worker parks this handler's pod (gVisor: checkpointed to disk, its processes
    ended). The handler lets go of what the checkpoint cannot hold (its output FIFO and its
    channel, both the host's), says so, and resumes in the pod restored from the image: it
    reaches the worker again, says which process it is, takes its new output FIFO and says
    it is bound. Its globals, imports and open files of its own are as they were. The
    lambda's park hooks (sprout.on_park) run first. Returns its new channel."""
    platform = sys.modules.get("sprout.platform")
    if platform is not None:
        platform._run_park_hooks()  # sprout.on_park: connections to services let go
    load.redirect_output("/dev/null")
    channel.send_frame(sock, {"op": "parked"})
    sock.close()
    sock = channel.reconnect()
    channel.send_frame(sock, {"op": "resumed", "pid": os.getpid()})
    bind, _ = channel.recv_frame(sock)
    load.redirect_output(bind.get("output"))
    channel.send_frame(sock, {"op": "bound"})
    return sock


def kill_leftovers(init):
    """End every process the request left behind. As PID 1 of the sandbox's PID namespace
    (`init`), kill(-1) reaches all of them at once, and each one's exit reparents its orphans to us.
    A pod's handler is not PID 1 but a subreaper (pod.py), so it kills its children,
    found in /proc, until none is left.

    Most requests leave nothing: every process of the namespace descends from PID 1 (an
    orphan is reparented to it), so with no child there is nobody, and the kill, whose
    kernel walk visits every process of the host, is skipped."""
    if not init:
        if POD_HANDLER and has_children():
            kill_children()
        return
    if not has_children():
        return  # so no other process in the namespace
    try:
        os.kill(-1, signal.SIGKILL)
        block = 0
    except ProcessLookupError:
        block = os.WNOHANG  # nobody left running; only reap what already exited
    while True:
        try:
            pid, _status = os.waitpid(-1, block)
        except ChildProcessError:
            return
        if pid == 0:
            return


POD_HANDLER = False  # this process is a handler forked in a pod


def has_children():
    """Whether this process has a child (running, exited or reparented here): one system
    call, where scanning /proc costs a pod's handler milliseconds on every request."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def kill_children():
    """SIGKILL this process's children (orphans of theirs reparent here, a subreaper, and are
    killed in the next round) until none is left, and reap them."""
    me = str(os.getpid())
    for _ in range(100):
        children = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as stat:
                        fields = stat.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if fields[1] == me:
                    children.append(int(entry))
        if not children:
            return
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
