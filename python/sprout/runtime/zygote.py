"""The Zygote role: warm up once, then fork new sandboxes in the C provisioning loop.

The loop is libsprout.so's (crates/sandbox/csrc/zygote.c). Each child returns into Python
here as a handler (handler.py), a spare (forked ahead, bound to a sandbox later) or a new
Zygote that imports the packages, or loads the shared code, the worker names.

Loaded by the helper by path, as ``_sprout_zygote`` (load.py); standard library only.
"""

import os
import socket
import sys

import _sprout_load as load

channel = load.runtime_module("channel")
dispatch = load.runtime_module("dispatch")
handler = load.runtime_module("handler")

ROLE_HANDLER, ROLE_ZYGOTE, ROLE_SPARE = 0, 1, 2


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
    server = load.runtime_module("asgi").Server(_warm_asgi_app)
    server.invoke({"method": "GET", "path": "/", "headers": [["Host", "h"]]}, b"")
    server.loop.close()


def warm_up():
    """Run the handler's code paths once, so that what they build on first use (import
    machinery caches, compiled regexes, codecs) is built here, shared by every fork."""
    load.set_path([])
    with open(__file__, "rb") as source:
        compile(source.read(), __file__, "exec", dont_inherit=True)
    dispatch.invoke_function(lambda event: event, {}, b'{"a": [1, 2.5, "x", null, true]}')
    dispatch.invoke_function(lambda event: 1 / 0, {}, b"")
    dispatch.invoke_batch(lambda event: 1 / event, {}, b"[1, 0]")
    request = {"method": "GET", "path": "/a%20b", "query": "q=1", "headers": [["Host", "h:80"], ["X-A", "b"]]}
    dispatch.invoke_wsgi(_warm_app, request, b"")
    load.apply_init({"env": {}})
    load.package_modules(len(sys.modules) - 1)


def import_packages(sock):
    """A new child Zygote: put its packages on sys.path and import what the worker names.
    Returns False when the worker hung up instead."""
    import gc
    import importlib

    try:
        order, _ = channel.recv_frame(sock)
    except EOFError:
        return False
    paths = order.get("paths") or []
    sys.path[:] = [p for p in paths if p.startswith(load.PACKAGES_DIR)] + load.BASE_PATH
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
    channel.send_frame(sock, {"op": "hello", "role": "zygote", "imported": imported, "failed": failed, "absent": absent})
    return True


def load_shared_code(sock, paths, code):
    """A code Zygote: import the shared code's modules from /handler with the lambda's
    sys.path, then call its `module:function`; say hello, or why it failed (and stop)."""
    import importlib

    load.set_path(paths)
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
        channel.send_frame(sock, {"op": "hello", "role": "zygote", "error": "load_error",
                                  "message": f"{type(exc).__name__}: {exc}"[:2000], "traceback": dispatch.short_traceback(exc)})
        return False
    load.SHARED_CODE = True
    sys.stdout.flush()
    sys.stderr.flush()
    channel.send_frame(sock, {"op": "hello", "role": "zygote", "imported": [], "failed": {}})
    return True


def prefault():
    """Run a handler's start and one request through a socket pair, so that the pages they
    write are this process's own copies before it is bound (a fork shares them with the
    Zygote until first written). Nothing of it outlives the call."""
    ours, theirs = socket.socketpair()
    try:
        channel.send_frame(ours, {"op": "init", "env": {}, "paths": []})
        init, _ = channel.recv_frame(theirs)
        load.apply_init(init)
        channel.install_calls(theirs)
        source = "def f(event):\n    return event\n"
        module = type(sys)("f")
        exec(compile(source, load.HANDLER_DIR + "/f.py", "exec", dont_inherit=True), module.__dict__)
        header, out = dispatch.invoke_function(module.f, {"method": "POST"}, b'{"a": [1, "x"]}')
        load.package_modules(len(sys.modules) - 1)
        channel.send_frame(theirs, header, out)
        channel.recv_frame(ours)
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
    """Warm up, say hello over `sock`, then serve forks in the C loop until the worker hangs
    up. A child forked as a handler (or a spare, once bound) serves its lambda; one forked as
    a Zygote imports its packages, or loads its shared code, and serves forks in turn."""
    import ctypes
    import gc

    lib = ctypes.PyDLL(os.path.join(load.RUNTIME_DIR, "libsprout.so"))  # keeps the GIL across forks
    provision = lib.sprout_zygote_serve
    provision.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    provision.restype = ctypes.c_int
    spare_wait = lib.sprout_spare_wait
    spare_wait.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    spare_wait.restype = ctypes.c_int
    after_fork_in_child = ctypes.pythonapi.PyOS_AfterFork_Child
    role = ctypes.c_int(ROLE_HANDLER)
    warm_up()
    channel.send_frame(sock, {"op": "hello", "role": "zygote"})
    collect = True
    while True:
        if collect:
            gc.collect()
        gc.freeze()  # keep the shared heap out of the collector so forks stay copy-on-write
        link = provision(sock.fileno(), ctypes.byref(role))  # returns in a child, or at hang-up
        if link < 0:
            return
        after_fork_in_child()
        sock.detach()  # already closed by the child
        if role.value == ROLE_SPARE:
            link = serve_spare(spare_wait, link, ctypes.byref(role))
            if link < 0:
                return
        sock = socket.socket(fileno=link)
        if role.value != ROLE_ZYGOTE:
            handler.serve_lambda(sock)
            return
        if not import_packages(sock):
            return
        # A package Zygote's imports leave next to no cyclic garbage, and a full collection
        # of a large package's heap (about 14 ms for django) would hold up its first fork,
        # for which a request waits: freezing alone keeps its heap out of the forks'
        # collections. A code Zygote's code may have run anything: it collects first.
        collect = load.SHARED_CODE
