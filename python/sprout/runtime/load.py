"""Loading code by path: the runtime's own modules, and a handler's lambda.

The runtime's modules sit beside this file and are loaded as ``_sprout_<name>``
(:func:`runtime_module`). A handler's lambda: the worker's init frame (environment, sys.path,
limits), its entry point, and the package modules it loaded, which the worker's import cache
learns from.

helper.py loads this module by path, as ``_sprout_load``; the others reach it with ``import
_sprout_load``. Standard library only.
"""

import os
import sys

RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))
HANDLER_DIR = "/handler"
PACKAGES_DIR = "/packages/"
PLATFORM_DIR = "/opt/sprout/python"  # the `sprout` package (services, invoke, store, cache)
BASE_PATH = list(sys.path)  # the interpreter's own (standard library) entries
MAX_LEARNED = 300  # package modules reported per package

SHARED_CODE = False  # this process was forked from a code Zygote (its /handler was listed there)
MEMORY_LIMITED = False  # this handler's address space is limited (a pod's: apply_init)


def exec_file(name, path):
    """Compile the Python file at `path` and run it as a new module `name` (in sys.modules
    while it runs, as an import would have it), without importlib's loaders (see
    load_lambda)."""
    with open(path, "rb") as source:
        code = compile(source.read(), path, "exec", dont_inherit=True)
    module = type(sys)(name)
    module.__file__ = path
    sys.modules[name] = module
    exec(code, module.__dict__)
    return module


def runtime_module(name):
    """A module of the runtime beside this file (/opt/sprout/<name>.py), loaded by path as
    ``_sprout_<name>``: a lambda's own module of that name must neither shadow it nor be
    shadowed."""
    loaded = sys.modules.get("_sprout_" + name)
    if loaded is not None:  # loaded already (in the Zygote, before the fork)
        return loaded
    return exec_file("_sprout_" + name, os.path.join(RUNTIME_DIR, name + ".py"))


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

    Compiled and executed directly (exec_file) rather than through importlib's loaders:
    after a fork, every page the interpreter touches is copied, and the loaders touch many."""
    sys.dont_write_bytecode = True  # /handler and /packages are read-only
    if SHARED_CODE:
        sys.path_importer_cache.pop(HANDLER_DIR, None)  # list this lambda's own /handler afresh
    entry_file = os.environ.get("OL_ENTRY_FILE", "f.py")
    name = entry_file[:-3]
    module = exec_file(name, HANDLER_DIR + "/" + entry_file)
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


def redirect_output(path):
    """Send this process's stdout and stderr to `path` (a FIFO the worker reads, or
    /dev/null), if given."""
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def apply_init(init):
    """The worker's first frame: environment variables and package paths of this lambda; for
    a pod's handler also where its output goes (a FIFO the worker reads) and its memory
    limit (its address space, which gVisor enforces per process)."""
    global MEMORY_LIMITED
    redirect_output(init.get("output"))
    limit = init.get("memory_bytes")
    if limit:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        MEMORY_LIMITED = True
    env = init.get("env")
    if env:
        os.environ.update(env)
    set_path(init.get("paths") or [])
