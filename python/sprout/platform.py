"""The platform as a library, inside a sandbox: the services a lambda may reach, and other
lambdas to call.

    import sprout

    sprout.services()                    # {"postgres": "10.224.0.1:5432", "cache": "10.224.0.2:11211"}
    host, port = sprout.service("cache")  # ("10.224.0.2", 11211)
    sprout.invoke("resize", {"w": 64})   # another lambda's result, through the worker

A sandbox reaches only the services its worker's ``[[network.allow]]`` lists for its lambda;
each is also its name in the sandbox's ``/etc/hosts`` (``postgresql://olio@postgres:5432/olio``
just works). Outside a sandbox, ``services()`` reads the same ``SPROUT_SERVICE_<NAME>``
variables, so code runs the same under a test runner that sets them.

``invoke`` travels over the sandbox's own channel to the worker, never over the network:
the callee runs with the same limits and errors as ``POST /run/<name>``; a failure raises
:class:`InvokeError` with the status and the stable error code the HTTP API would answer
with. Calls nest up to the worker's ``limits.max_invoke_depth``; a lambda can call others but
never deploy, replace or delete one.
"""

import json
import os
import sys

from sprout.client import SproutError

PREFIX = "SPROUT_SERVICE_"


class InvokeError(SproutError):
    """A lambda called with :func:`invoke` failed, or could not be called: the worker's
    error as `/run` would have answered it (status, code, message, traceback)."""


def services(environ=None):
    """{name: "address:port"} of the services this sandbox may reach."""
    environ = os.environ if environ is None else environ
    return {key[len(PREFIX):].lower().replace("_", "-"): value for key, value in environ.items() if key.startswith(PREFIX)}


def service(name, environ=None):
    """(host, port) of the service `name`; KeyError naming the services there are."""
    found = services(environ)
    if name not in found:
        raise KeyError(f"no service {name!r} here (this sandbox may reach: {', '.join(sorted(found)) or 'none'})")
    host, _, port = found[name].rpartition(":")
    return host, int(port)


_PARK_HOOKS = []


def on_park(fn):
    """Call ``fn()`` before this sandbox is parked (a gVisor pod written to disk, its
    processes ended until its next request restores them, globals and all): let go of what
    the image cannot keep, connections to services above all (each would hold a server
    process while the site sleeps; ``sprout.store`` lets its PostgreSQL connections go on its
    own). A hook that raises is reported in the lambda's log and the park goes on. Returns
    ``fn``, so it serves as a decorator."""
    _PARK_HOOKS.append(fn)
    return fn


def _run_park_hooks():
    """Run the hooks (the runtime calls this when the worker parks the sandbox)."""
    import traceback

    for fn in list(_PARK_HOOKS):
        try:
            fn()
        except Exception:
            traceback.print_exc()


def _channel():
    channel = sys.modules.get("_sprout_sandbox")
    if channel is None:
        raise RuntimeError("sprout.invoke works only inside a Sprout sandbox")
    return channel


def request_id():
    """The id of the request this handler serves (its `X-Sprout-Request-Id`, the one its log
    lines carry); "" outside a request or a sandbox."""
    channel = sys.modules.get("_sprout_sandbox")
    return getattr(channel, "request_id", "") if channel is not None else ""


def invoke(name, event=None):
    """Run the lambda `name` on `event` (anything JSON encodes) and return its result."""
    if not isinstance(name, str) or not name:
        raise TypeError("invoke() needs a lambda's name")
    body = json.dumps(event).encode()
    header, reply = _channel().call(name, body)
    if "error" in header:
        raise InvokeError(header.get("status", 500), header["error"], header.get("message", ""), header)
    if not reply:
        return None
    try:
        return json.loads(reply)
    except ValueError:
        return reply.decode("utf-8", "replace")
