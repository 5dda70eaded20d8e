"""Sprout's in-sandbox helper: serves one lambda over the worker's Unix socket, or, as a
Zygote, provisions new sandboxes by fork (SOCK, section 4.2).

It runs inside a sandbox on the base image's own python3, started with -I -S, so it uses the
standard library only. Three roles:

    helper.py zygote    an initialized interpreter that forks new sandboxes on request
    helper.py handler   loads the lambda's entry module (/handler/f.py, or the file named by
                        OL_ENTRY_FILE) and serves requests for it: f(event), a WSGI app
                        or an ASGI app (see asgi.py)
    helper.py vm        a microVM's only program (the vm back-end): warms up, waits for the
                        worker on vsock port 1024, receives the lambda's code into /handler,
                        then serves as a handler
    helper.py pod       the Zygote inside one lambda's gVisor sandbox (the gvisor back-end):
                        imports the lambda's packages, then forks spares on the worker's
                        request, each of which connects on its own and becomes a handler

Both connect to /host/sprout.sock, where the worker listens, and speak frames:
``<u32 header length><u32 body length><JSON header><body bytes>`` (little endian). A handler
first receives ``{"op": "init", "env": {...}, "paths": [...]}`` (its packages' directories
for sys.path), loads the lambda, says hello (naming the package modules the lambda loaded,
which the worker's import cache learns from), then answers one request frame with one reply
frame until the worker hangs up.

A Zygote says hello and hands its socket to the provisioning loop in libsprout.so (C, see
crates/sandbox/csrc/zygote.c), which never returns to Python in the Zygote: Python code
running there would write to the shared heap, and after every fork each page written is
copied. For each fork request the loop clones a child into new PID, IPC and UTS namespaces
(the namespace flags go to clone itself, so SOCK's second fork is unnecessary); the child
enters its root with fchdir + chroot, joins its cgroups, takes its user, connects to its
own socket and returns into Python here, either as a handler or as a new Zygote (SOCK's
import cache, section 4.3): a child Zygote receives ``{"op": "zygote", "paths": [...],
"imports": [...]}``, imports those modules from those package directories, says which
imports failed, and serves forks in turn. A package Zygote never loads lambda code, and
imports only packages every lambda forked from it asked for, so no function sees another's
state or code it did not request. A code Zygote's order also carries ``"code": {"modules":
[...], "call": "module:function"}``: its /handler is code that several lambdas share but for
their settings files (which it does not hold), and it imports those modules from there and
calls that function, so each of those lambdas' handlers starts with its application loaded;
any failure there is the Zygote's, and the worker forks their handlers elsewhere.

A spare is a third kind of child: forked ahead of demand, bound to no lambda. It warms its
own copy of the handler's paths, then waits in C until the worker binds it to a sandbox,
when it enters that root exactly as a freshly forked handler would and serves as one. It
is bound at most once, so it has never held any lambda's code, environment or files.
"""

import io
import json
import os
import signal
import socket
import struct
import sys
import threading
import traceback

SOCKET_PATH = "/host/sprout.sock"
HANDLER_DIR = "/handler"
PACKAGES_DIR = "/packages/"
PLATFORM_DIR = "/opt/sprout/python"  # the `sprout` package (services, invoke, store, cache)
FRAME = struct.Struct("<II")
MAX_HEADER = 1 << 20
BASE_PATH = list(sys.path)  # the interpreter's own (standard library) entries
MAX_LEARNED = 300  # package modules reported per package
LEARN_REQUESTS = 3  # requests after which a handler reports modules they loaded lazily

ROLE_HANDLER, ROLE_ZYGOTE, ROLE_SPARE = 0, 1, 2
SHARED_CODE = False  # this process was forked from a code Zygote (its /handler was listed there)


# ---------------------------------------------------------------- framing


def send_frame(sock, header, body=b""):
    head = json.dumps(header, separators=(",", ":")).encode()
    sock.sendall(FRAME.pack(len(head), len(body)) + head + body)


def _recv_exact(sock, n, into=None):
    buf = bytearray(n) if into is None else into
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("worker closed the channel")
        got += k
    return buf


def recv_frame(sock):
    """Read one frame; returns (header, body)."""
    head_len, body_len = FRAME.unpack(_recv_exact(sock, FRAME.size))
    if head_len > MAX_HEADER:
        raise ValueError("frame header too large")
    head = _recv_exact(sock, head_len)
    body = bytes(_recv_exact(sock, body_len)) if body_len else b""
    return json.loads(head), body


def connect():
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(SOCKET_PATH)
    return sock


# ---------------------------------------------------------------- handler role


def _short_traceback(exc):
    """The traceback from the handler's frames down, without the helper's own frame."""
    tb = exc.__traceback__
    if tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


EXIT_OUT_OF_MEMORY = 75  # a pod's handler past its memory limit (see serve_pod)
MEMORY_LIMITED = False  # this handler's address space is limited (a pod's: apply_init)


def _error(code, message, exc=None):
    if MEMORY_LIMITED and isinstance(exc, MemoryError):
        # What the kernel's OOM killer does to a lean sandbox: the handler dies, and its pod
        # tells the worker why (its exit status).
        os._exit(EXIT_OUT_OF_MEMORY)
    header = {"error": code, "message": message}
    if exc is not None:
        header["traceback"] = _short_traceback(exc)
    return header, b""


def set_path(package_paths):
    """sys.path: the lambda's code, its packages (and nothing else), the standard library,
    and last the platform's `sprout` package (a lambda bringing its own copy wins)."""
    sys.path[:] = [HANDLER_DIR] + [p for p in package_paths if p.startswith(PACKAGES_DIR)] + BASE_PATH + [PLATFORM_DIR]


def package_modules(since=0):
    """The modules loaded from each package directory since sys.modules held `since`
    entries: {"/packages/<name>==<v>": [module, ...]}. Only the newest entries are visited
    (dicts keep insertion order): touching the Zygote's shared objects would copy pages."""
    import itertools

    found = {}
    added = len(sys.modules) - since
    if added <= 0:
        return found
    for name, module in itertools.islice(reversed(sys.modules.items()), added):
        origin = getattr(module, "__file__", None)
        if isinstance(origin, str) and origin.startswith(PACKAGES_DIR):
            package = "/".join(origin.split("/", 3)[:3])
            names = found.setdefault(package, [])
            if len(names) < MAX_LEARNED:
                names.append(name)
    return found


def is_coroutine_callable(obj):
    """Whether calling `obj` makes a coroutine (an ASGI app), without importing inspect."""
    CO_COROUTINE = 0x80
    for function in (obj, type(obj).__call__):  # a function itself, or a class with async __call__
        code = getattr(getattr(function, "__func__", function), "__code__", None)
        if code is not None and code.co_flags & CO_COROUTINE:
            return True
    return False


def load_lambda():
    """Load the entry file (OL_ENTRY_FILE, by default f.py) as its module and find its entry
    point as OpenLambda does: the callable named by OL_WSGI_ENTRY (WSGI) or OL_ASGI_ENTRY
    (ASGI), else ``f`` (a function of the event), else ``app`` (ASGI when calling it makes a
    coroutine, WSGI otherwise). Returns (kind, entry).

    Compiled and executed directly rather than through importlib's loaders: after a fork,
    every page the interpreter touches is copied, and the loaders touch many."""
    sys.dont_write_bytecode = True  # /handler and /packages are read-only
    if SHARED_CODE:
        sys.path_importer_cache.pop(HANDLER_DIR, None)  # list this lambda's own /handler afresh
    entry_file = os.environ.get("OL_ENTRY_FILE", "f.py")
    name = entry_file[:-3]
    path = HANDLER_DIR + "/" + entry_file
    with open(path, "rb") as source:
        code = compile(source.read(), path, "exec", dont_inherit=True)
    module = type(sys)(name)
    module.__file__ = path
    sys.modules[name] = module
    exec(code, module.__dict__)
    for variable, kind in (("OL_WSGI_ENTRY", "wsgi"), ("OL_ASGI_ENTRY", "asgi")):
        attribute = os.environ.get(variable)
        if attribute:
            entry = getattr(module, attribute, None)
            if not callable(entry):
                raise LookupError(f"{entry_file} has no callable {attribute} ({variable})")
            return kind, entry
    func = getattr(module, "f", None)
    if callable(func):
        return "function", func
    app = getattr(module, "app", None)
    if callable(app):
        return ("asgi" if is_coroutine_callable(app) else "wsgi"), app
    raise LookupError(f"{entry_file} defines neither f(event) nor a WSGI or ASGI callable named app")


def load_runtime_module(name):
    """A module of the runtime beside this file (/opt/sprout/<name>.py), loaded by path: a
    lambda's own module of that name must neither shadow it nor be shadowed."""
    loaded = sys.modules.get("_sprout_" + name)
    if loaded is not None:  # loaded in the Zygote before the fork
        return loaded
    path = os.path.join(RUNTIME_DIR, name + ".py")
    with open(path, "rb") as source:
        code = compile(source.read(), path, "exec", dont_inherit=True)
    module = type(sys)("_sprout_" + name)
    module.__file__ = path
    sys.modules[module.__name__] = module
    exec(code, module.__dict__)
    return module


def call_function(func, event, allow_nan=True):
    """f(event): (its result as JSON, None), or (None, the error header) when it raised or
    returned what JSON cannot encode (with allow_nan=False, NaN and infinities too)."""
    try:
        result = func(event)
    except BaseException as exc:  # a handler's SystemExit is its failure too
        return None, _error("handler_exception", f"{type(exc).__name__}: {exc}", exc)[0]
    try:
        return json.dumps(result, allow_nan=allow_nan).encode(), None
    except (TypeError, ValueError) as exc:
        return None, _error("invalid_result", f"handler returned a value JSON cannot encode: {exc}")[0]


JSON_REPLY = {"status": 200, "headers": [["Content-Type", "application/json"]]}


def invoke_function(func, request, body):
    if body.strip():
        try:
            event = json.loads(body)
        except ValueError as exc:
            return _error("invalid_json", f"request body is not JSON: {exc}")
    else:
        event = None
    out, error = call_function(func, event)
    if error is not None:
        return error, b""
    return dict(JSON_REPLY), out


BLOB_DIR = "/blobs"  # the worker's blob store (crates/worker/src/blobs.rs)
BLOB_KEY = "$sprout_blob"
BLOB_MIN = 1 << 20  # a map's result whose JSON is larger goes to the blob store


def _blob_path(name):
    if not isinstance(name, str) or not 1 <= len(name) <= 128 or name.startswith(".") or \
            not all(c.isascii() and (c.isalnum() or c in "._-") for c in name):
        raise ValueError(f"{name!r} is not a blob's name")
    return os.path.join(BLOB_DIR, name)


def unblob(event):
    """A map's item: ``{"$sprout_blob": name}`` is the JSON in blob ``name`` (an item too
    large for a request body, docs/offload.md); anything else is itself."""
    if isinstance(event, dict) and len(event) == 1 and BLOB_KEY in event:
        with open(_blob_path(event[BLOB_KEY]), "rb") as f:
            return json.loads(f.read())
    return event


def blob_outcome(out):
    """A result's JSON too large for the reply frame, written as a blob of its own (128
    random bits name it; only this sandbox's user owns it): ``{"blob": name}``. None when it
    is small, or there is no blob store."""
    if len(out) <= BLOB_MIN or not os.path.isdir(BLOB_DIR):
        return None
    name = os.urandom(16).hex() + ".json"
    fd = os.open(_blob_path(name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(out)
    return json.dumps({"blob": name}).encode()


def invoke_batch(func, request, body):
    """A chunk of a map: the body is a JSON array of events; f(event) runs for each in turn,
    and the reply is a JSON array of their outcomes, ``{"result": r}``, ``{"blob": name}``
    (a result of more than BLOB_MIN bytes of JSON, in the blob store) or ``{"error": code,
    "message": m, "traceback": t}`` (an item's failure is its own; the others go on). An
    event ``{"$sprout_blob": name}`` is read from the blob store first."""
    try:
        events = json.loads(body)
    except ValueError as exc:
        return _error("invalid_json", f"a batch's body is not JSON: {exc}")
    if not isinstance(events, list):
        return _error("invalid_json", "a batch's body must be a JSON array of events")
    outcomes = []
    for event in events:
        try:
            event = unblob(event)
        except (OSError, ValueError) as exc:
            error = _error("invalid_json", f"the item's blob cannot be read: {type(exc).__name__}: {exc}")[0]
            outcomes.append(json.dumps({**error, "traceback": None}).encode())
            continue
        out, error = call_function(func, event, allow_nan=False)  # the worker reads the outcomes
        if error is None:
            try:
                outcomes.append(blob_outcome(out) or b'{"result":' + out + b"}")
            except OSError as exc:
                error = _error("invalid_result", f"the result ({len(out)} bytes of JSON) cannot be written as a blob: {exc}")[0]
        if error is not None:
            error.setdefault("traceback", None)
            outcomes.append(json.dumps(error).encode())
    return dict(JSON_REPLY), b"[" + b",".join(outcomes) + b"]"


def wsgi_environ(request, body):
    from urllib.parse import unquote_to_bytes

    headers = request.get("headers", [])
    host = next((v for k, v in headers if k.lower() == "host"), "localhost")
    name, _, port = host.partition(":")
    environ = {
        "REQUEST_METHOD": request.get("method", "POST"),
        "SCRIPT_NAME": request.get("script_name", ""),
        "PATH_INFO": unquote_to_bytes(request.get("path", "/") or "/").decode("latin-1"),
        "QUERY_STRING": request.get("query", ""),
        "SERVER_NAME": name,
        "SERVER_PORT": port or "80",
        "SERVER_PROTOCOL": request.get("protocol", "HTTP/1.1"),
        "REMOTE_ADDR": request.get("remote_addr", ""),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": False,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    for key, value in headers:
        key = key.upper().replace("-", "_")
        if key == "CONTENT_TYPE":
            environ["CONTENT_TYPE"] = value
        elif key == "CONTENT_LENGTH":
            environ["CONTENT_LENGTH"] = value
        else:
            name = "HTTP_" + key
            environ[name] = environ[name] + "," + value if name in environ else value
    environ.setdefault("CONTENT_LENGTH", str(len(body)))
    return environ


def invoke_wsgi(app, request, body):
    started = []

    def start_response(status, response_headers, exc_info=None):
        if exc_info is not None and started:
            raise exc_info[1].with_traceback(exc_info[2])
        started[:] = [(status, list(response_headers))]
        return lambda data: chunks.append(bytes(data))

    chunks = []
    try:
        result = app(wsgi_environ(request, body), start_response)
        try:
            for chunk in result:
                chunks.append(bytes(chunk))
        finally:
            if hasattr(result, "close"):
                result.close()
    except BaseException as exc:
        return _error("handler_exception", f"{type(exc).__name__}: {exc}", exc)
    if not started:
        return _error("invalid_result", "WSGI app returned without calling start_response")
    status, response_headers = started[0]
    try:
        code = int(str(status).split(" ", 1)[0])
    except ValueError:
        return _error("invalid_result", f"WSGI app gave a malformed status {status!r}")
    return {"status": code, "headers": [[k, v] for k, v in response_headers]}, b"".join(chunks)


def refuse_batch(kind):
    """What answers a map's chunk for a lambda that is a WSGI or ASGI app: a refusal, before
    the app sees anything."""
    def refuse(_app, _request, _body):
        return _error("not_a_function", f"the lambda is a {kind.upper()} app; a map calls a function f(event)")
    return refuse


def kill_leftovers():
    """End every process the request left behind. As PID 1 of the sandbox's PID namespace,
    kill(-1) reaches all of them at once, and each one's exit reparents its orphans to us.
    A pod's handler is not PID 1 but a subreaper (serve_pod), so it kills its children,
    found in /proc, until none is left."""
    if os.getpid() != 1:
        if POD_HANDLER and has_children():
            kill_children()
        return
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


class Calls:
    """What ``sprout.invoke`` reaches (as module ``_sprout_sandbox``): calls to other lambdas,
    made over this sandbox's channel while the handler serves a request. The worker, which is
    waiting for the request's reply, answers each call frame with one frame; calls from several
    threads take turns."""

    def __init__(self, sock):
        self.sock = sock
        self.serving = False
        self.lock = threading.Lock()

    def call(self, name, body, batch=False):
        """Run lambda `name` on the event `body` (JSON); with `batch`, on each event of the JSON
        array `body` (a map: the reply's body is the array of their outcomes). Returns the
        worker's reply frame: (header, body)."""
        header = {"op": "invoke", "lambda": name}
        if batch:
            header["batch"] = True
        with self.lock:
            if not self.serving:
                raise RuntimeError("sprout.invoke can be called only while the lambda serves a request")
            send_frame(self.sock, header, body)
            return recv_frame(self.sock)


def install_calls(sock):
    module = type(sys)("_sprout_sandbox")
    calls = Calls(sock)
    module.call = calls.call
    module.request_id = ""  # the request under way (sprout.request_id())
    sys.modules["_sprout_sandbox"] = module
    return calls, module


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


def apply_init(init):
    """The worker's first frame: environment variables and package paths of this lambda; for
    a pod's handler also where its output goes (a FIFO the worker reads) and its memory
    limit (its address space, which gVisor enforces per process)."""
    global MEMORY_LIMITED
    output = init.get("output")
    if output:
        fd = os.open(output, os.O_WRONLY | os.O_CLOEXEC)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    limit = init.get("memory_bytes")
    if limit:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        MEMORY_LIMITED = True
    env = init.get("env")
    if env:
        os.environ.update(env)
    set_path(init.get("paths") or [])


def serve_lambda(sock):
    try:
        init, _ = recv_frame(sock)
    except EOFError:
        return
    apply_init(init)
    calls, channel = install_calls(sock)
    modules_before = len(sys.modules)
    server = None
    try:
        kind, entry = load_lambda()
        if kind == "asgi":
            server = load_runtime_module("asgi").Server(entry)
            server.startup()  # lifespan: once per sandbox, after the fork
    except BaseException as exc:
        send_frame(sock, {"op": "hello", "error": "load_error",
                          "message": f"{type(exc).__name__}: {exc}",
                          "traceback": _short_traceback(exc)})
        return
    logging_settled = configure_logging()
    send_frame(sock, {"op": "hello", "kind": kind, "package_modules": package_modules(modules_before)})
    invoke = {"wsgi": invoke_wsgi, "function": invoke_function}.get(kind)
    if server is not None:
        def invoke(_app, request, body):
            return server.invoke(request, body)
    invoke_many = invoke_batch if kind == "function" else refuse_batch(kind)
    served = 0
    while True:
        try:
            request, body = recv_frame(sock)
        except EOFError:
            if server is not None:
                server.shutdown()
            return
        modules_before = len(sys.modules)
        if not logging_settled:
            logging_settled = configure_logging()
        channel.request_id = request.get("request_id", "")
        calls.serving = True
        try:
            header, out = (invoke_many if request.get("batch") else invoke)(entry, request, body)
        finally:
            with calls.lock:  # a call still under way in another thread finishes first
                calls.serving = False
            channel.request_id = ""
        served += 1
        if served <= LEARN_REQUESTS and len(sys.modules) > modules_before:
            # Packages often import parts of themselves on first use (Pillow's file formats).
            learned = package_modules(modules_before)
            if learned:
                header["package_modules"] = learned
        sys.stdout.flush()
        sys.stderr.flush()
        kill_leftovers()
        send_frame(sock, header, out)


# ---------------------------------------------------------------- zygote role

RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))


def _warm_app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [environ["PATH_INFO"].encode()]


async def _warm_asgi_app(scope, receive, send):
    if scope["type"] == "http":
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"warm"})


def warm_asgi():
    """Load the ASGI server and run one request through it in this Zygote, so its forks
    share both. Only in a child Zygote whose packages imported asyncio anyway: in the root
    one, asyncio's pages would make every fork's page tables larger (measured: +0.2-0.6 ms
    on every cold start) to save a bare ASGI app's import (about 20 ms). The event loop is
    closed again, so none of its descriptors reaches a fork."""
    server = load_runtime_module("asgi").Server(_warm_asgi_app)
    server.invoke({"method": "GET", "path": "/", "headers": [["Host", "h"]]}, b"")
    server.loop.close()


def warm_up():
    """Run the handler's code paths once, so that what they build on first use (import
    machinery caches, compiled regexes, codecs) is built here, shared by every fork."""
    set_path([])
    with open(__file__, "rb") as source:
        compile(source.read(), __file__, "exec", dont_inherit=True)
    invoke_function(lambda event: event, {}, b'{"a": [1, 2.5, "x", null, true]}')
    invoke_function(lambda event: 1 / 0, {}, b"")
    invoke_batch(lambda event: 1 / event, {}, b"[1, 0]")
    request = {"method": "GET", "path": "/a%20b", "query": "q=1", "headers": [["Host", "h:80"], ["X-A", "b"]]}
    invoke_wsgi(_warm_app, request, b"")
    apply_init({"env": {}})
    package_modules(len(sys.modules) - 1)


def import_packages(sock):
    """A new child Zygote: put its packages on sys.path and import what the worker names.
    Returns False when the worker hung up instead."""
    import gc
    import importlib

    try:
        order, _ = recv_frame(sock)
    except EOFError:
        return False
    paths = order.get("paths") or []
    sys.path[:] = [p for p in paths if p.startswith(PACKAGES_DIR)] + BASE_PATH
    code = order.get("code")
    if code is not None:
        return load_shared_code(sock, paths, code)
    imported, failed = [], {}
    absent = []
    # Imports make objects by the hundred thousand and next to no cyclic garbage: the
    # collector's passes over them (3-7% of django's or Pillow's import time) are skipped,
    # as the heap is frozen uncollected before the first fork anyway.
    gc.disable()
    for name in order.get("imports") or []:
        try:
            importlib.import_module(name)
            imported.append(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                absent.append(name)  # a name a module defines (`from X import Y`), not a module
            else:
                failed[name] = f"{type(exc).__name__}: {exc}"[:500]
        except BaseException as exc:  # a package's import may do anything, even exit
            failed[name] = f"{type(exc).__name__}: {exc}"[:500]
    gc.freeze()  # before the collector is back on, or its next pass walks every new object
    gc.enable()
    if "asyncio" in sys.modules:
        warm_asgi()  # its packages serve ASGI apps (Starlette, FastAPI, Quart...)
    sys.stdout.flush()
    sys.stderr.flush()
    send_frame(sock, {"op": "hello", "role": "zygote", "imported": imported, "failed": failed, "absent": absent})
    return True


def load_shared_code(sock, paths, code):
    """A code Zygote: import the shared code's modules from /handler with the lambda's
    sys.path, then call its `module:function`; say hello, or why it failed (and stop)."""
    global SHARED_CODE
    import importlib

    set_path(paths)
    sys.dont_write_bytecode = True  # /handler is read-only
    try:
        for name in code.get("modules") or []:
            importlib.import_module(name)
        call = code.get("call")
        if call:
            module, _, function = call.partition(":")
            getattr(importlib.import_module(module), function)()
    except BaseException as exc:  # the code may do anything, even exit
        sys.stdout.flush()
        sys.stderr.flush()
        send_frame(sock, {"op": "hello", "role": "zygote", "error": "load_error",
                          "message": f"{type(exc).__name__}: {exc}"[:2000], "traceback": _short_traceback(exc)})
        return False
    SHARED_CODE = True
    sys.stdout.flush()
    sys.stderr.flush()
    send_frame(sock, {"op": "hello", "role": "zygote", "imported": [], "failed": {}})
    return True


def prefault():
    """Run a handler's start and one request through a socket pair, so that the pages they
    write are this process's own copies before it is bound (a fork shares them with the
    Zygote until first written). Nothing of it outlives the call."""
    ours, theirs = socket.socketpair()
    try:
        send_frame(ours, {"op": "init", "env": {}, "paths": []})
        init, _ = recv_frame(theirs)
        apply_init(init)
        install_calls(theirs)
        source = "def f(event):\n    return event\n"
        module = type(sys)("f")
        exec(compile(source, HANDLER_DIR + "/f.py", "exec", dont_inherit=True), module.__dict__)
        header, out = invoke_function(module.f, {"method": "POST"}, b'{"a": [1, "x"]}')
        package_modules(len(sys.modules) - 1)
        send_frame(theirs, header, out)
        recv_frame(ours)
    finally:
        sys.modules.pop("_sprout_sandbox", None)
        ours.close()
        theirs.close()


def serve_spare(wait, link, role):
    """A spare: a child forked ahead of demand, bound to no lambda yet. Fault in the pages a
    handler's start touches, then wait on `link` for the sandbox to become (`wait` is
    zygote.c's sprout_spare_wait). Returns the sandbox's channel, or -1 when the worker let
    the spare go."""
    prefault()
    return wait(link, role)


def serve_zygote(sock):
    import ctypes
    import gc

    lib = ctypes.PyDLL(os.path.join(RUNTIME_DIR, "libsprout.so"))  # keeps the GIL across forks
    provision = lib.sprout_zygote_serve
    provision.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    provision.restype = ctypes.c_int
    spare_wait = lib.sprout_spare_wait
    spare_wait.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    spare_wait.restype = ctypes.c_int
    after_fork_in_child = ctypes.pythonapi.PyOS_AfterFork_Child
    role = ctypes.c_int(ROLE_HANDLER)
    warm_up()
    send_frame(sock, {"op": "hello", "role": "zygote"})
    collect = True
    while True:
        if collect:
            gc.collect()
        gc.freeze()  # keep the shared heap out of the collector so forks stay copy-on-write
        channel = provision(sock.fileno(), ctypes.byref(role))  # returns in a child, or at hang-up
        if channel < 0:
            return
        after_fork_in_child()
        sock.detach()  # already closed by the child
        if role.value == ROLE_SPARE:
            channel = serve_spare(spare_wait, channel, ctypes.byref(role))
            if channel < 0:
                return
        sock = socket.socket(fileno=channel)
        if role.value != ROLE_ZYGOTE:
            serve_lambda(sock)
            return
        if not import_packages(sock):
            return
        # A package Zygote's imports leave next to no cyclic garbage, and a full collection
        # of a large package's heap (about 14 ms for django) would hold up its first fork,
        # for which a request waits: freezing alone keeps its heap out of the forks'
        # collections. A code Zygote's code may have run anything: it collects first.
        collect = SHARED_CODE


# ---------------------------------------------------------------- pod role

POD_HANDLER = False  # this process is a handler forked in a pod
PR_SET_CHILD_SUBREAPER = 36


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
    global POD_HANDLER
    import ctypes

    POD_HANDLER = True
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(ctypes.c_ulong(PR_SET_CHILD_SUBREAPER), ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if seccomp:
        install_seccomp(libc, bytes.fromhex(seccomp))
    prefault()
    if held:
        release, ready = held
        os.write(ready, b"r")
        os.close(ready)
        if os.read(release, 1) != b"g":
            return  # the Zygote went without letting it go
        os.close(release)
        if "random" in sys.modules:  # restored: every pod of the template had the same state
            sys.modules["random"].seed()
    sock = connect()
    send_frame(sock, {"op": "spare", "pid": os.getpid()})
    serve_lambda(sock)


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


RECONNECT_PAUSE = 0.0005  # seconds between a template's Zygote's tries to reach its new pod


def become_template(sock, order):
    """Make this pod a template: fork the spares `order` asks for, held until they are let
    go, wait until they are ready, say so, and hang up (a host connection cannot be saved).
    The worker then checkpoints the pod. Each pod restored from it resumes here: the Zygote
    reaches the new pod's socket (tried every RECONNECT_PAUSE until it is there), says hello
    as a restored pod naming its spares, and lets them go, each to connect on its own.
    Returns the new pod's control socket."""
    import time

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
    send_frame(sock, {"pids": pids, "ready": ready})
    sock.close()
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(SOCKET_PATH)
            break
        except OSError:
            sock.close()
            time.sleep(RECONNECT_PAUSE)
    send_frame(sock, {"op": "hello", "role": "pod", "restored": True, "spares": pids})
    os.write(release_w, b"g" * len(pids))
    os.close(release_w)
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
    """
    import gc

    warm_up()
    sock = connect()
    send_frame(sock, {"op": "hello", "role": "pod"})
    if not import_packages(sock):
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
            order, _ = recv_frame(sock)
        except (EOFError, OSError):
            return
        op = order.get("op")
        reap()
        if op == "spares":
            send_frame(sock, {"pids": fork_spares(sock, order)})
        elif op == "template":
            sock = become_template(sock, order)
        elif op == "status":
            reap()
            send_frame(sock, {"status": {str(p): ended.pop(p, None) for p in order.get("pids") or []}})
        elif op == "kill":
            try:
                os.kill(int(order["pid"]), signal.SIGKILL)
            except (ProcessLookupError, ValueError, KeyError):
                pass
            send_frame(sock, {})
        else:
            send_frame(sock, {"error": f"unknown op {op!r}"})


VSOCK_PORT = 1024
MAX_CODE_FILES = 10000


def receive_code(sock):
    """A microVM's first frame: ``{"op": "code", "files": [[path, size, mode], ...]}`` with the
    files' contents one after another as its body, written under /handler (a tmpfs)."""
    order, body = recv_frame(sock)
    if order.get("op") != "code":
        raise ValueError(f"expected the lambda's code, got {order.get('op')!r}")
    files = order.get("files") or []
    if len(files) > MAX_CODE_FILES:
        raise ValueError("too many code files")
    offset = 0
    root = os.path.realpath(HANDLER_DIR)
    for path, size, mode in files:
        target = os.path.realpath(os.path.join(root, path))
        if not target.startswith(root + "/") or size < 0 or offset + size > len(body):
            raise ValueError(f"bad code file entry {path!r}")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as out:
            out.write(body[offset:offset + size])
        os.chmod(target, mode & 0o755)
        offset += size


def serve_vm():
    """The helper of a microVM: init (crates/vmm/guest/init.c) starts it as the guest's only
    program. It warms up as a Zygote would, then waits on vsock for the worker (a VM restored
    from a snapshot resumes here, already warm); the first frame is the lambda's code, and
    from then on it is a handler, over vsock instead of a Unix socket."""
    import gc

    listener = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    listener.bind((socket.VMADDR_CID_ANY, VSOCK_PORT))
    listener.listen(1)
    warm_up()
    gc.collect()
    gc.freeze()
    print("sprout-helper: ready", flush=True)
    sock, _ = listener.accept()
    listener.close()
    receive_code(sock)
    serve_lambda(sock)


def main(argv):
    role = argv[1] if len(argv) > 1 else ""
    sys.stdout.reconfigure(line_buffering=True)  # a pipe to the worker's log
    sys.stderr.reconfigure(line_buffering=True)
    if role == "zygote":
        serve_zygote(connect())
    elif role == "handler":
        serve_lambda(connect())
    elif role == "vm":
        serve_vm()
    elif role == "pod":
        serve_pod()
    else:
        sys.exit("usage: helper.py zygote|handler|vm|pod")


if __name__ == "__main__":
    main(sys.argv)
