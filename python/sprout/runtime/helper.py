"""Sprout's in-sandbox helper: the program every sandbox starts, in one of four roles.

It serves one lambda over the worker's Unix socket, or, as a Zygote, provisions new
sandboxes by fork (SOCK, section 4.2).

It runs inside a sandbox on the base image's own python3, started with -I -S, so it uses the
standard library only. Its roles:

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

The helper's jobs are in modules beside it (/opt/sprout here, python/sprout/runtime in the
repository), each loaded by path under a name of its own (``_sprout_<name>``, never a
lambda's module's) only in the roles that need it:

    load.py      loading code by path: the runtime's modules, and a lambda (its init frame,
                 entry point and the package modules it loaded)
    channel.py   the frames, and the calls a handler makes to other lambdas (sprout.invoke)
    dispatch.py  one request on the lambda's entry: f(event), a map's batch, a WSGI app
    asgi.py      the ASGI server, for ASGI apps only
    handler.py   the handler role: the request loop, and ending what each request left
    zygote.py    the zygote role: warm-up, the fork loop, package and code Zygotes, spares
    pod.py       the pod role
    vm.py        the vm role

Each module uses only those listed above it.
"""

import os
import sys


def load_runtime():
    """The runtime's load.py, beside this file, loaded by path as module ``_sprout_load``
    (once: a process forked from a Zygote has it already). It loads the other modules."""
    load = sys.modules.get("_sprout_load")
    if load is None:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "load.py")
        load = sys.modules["_sprout_load"] = type(sys)("_sprout_load")
        load.__file__ = path
        with open(path, "rb") as source:
            exec(compile(source.read(), path, "exec", dont_inherit=True), load.__dict__)
    return load


load = load_runtime()


def main(argv):
    role = argv[1] if len(argv) > 1 else ""
    sys.stdout.reconfigure(line_buffering=True)  # a pipe to the worker's log
    sys.stderr.reconfigure(line_buffering=True)
    if role == "zygote":
        load.runtime_module("zygote").serve_zygote(load.runtime_module("channel").connect())
    elif role == "handler":
        load.runtime_module("handler").serve_lambda(load.runtime_module("channel").connect())
    elif role == "vm":
        load.runtime_module("vm").serve_vm()
    elif role == "pod":
        load.runtime_module("pod").serve_pod()
    else:
        sys.exit("usage: helper.py zygote|handler|vm|pod")


if __name__ == "__main__":
    main(sys.argv)
