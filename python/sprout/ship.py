"""Ship a Python function as a lambda, without pickling it: its module's source, the modules
of its project that it imports, and the installed versions of the third-party distributions
they import, deployed once under a name made of their content.

    name = sprout.ship.deploy(score, client)       # "fn-score-1a2b3c4d5e6f"; sprout.map does it

What is shipped (:func:`package`):

- the module that defines the function, from its source file. A function of ``__main__``
  (a script) ships the script under another module name (its file's, or ``_sprout_main``),
  so that its ``if __name__ == "__main__":`` block does not run in the sandbox. A function
  without a source file, a ``lambda`` expression, or one nested in another function cannot be
  shipped (TypeError);
- every module of the caller's project it imports, recursively: imports are read with
  :mod:`ast` (``import``, ``from ... import``, relative ones, and ``importlib.import_module``
  / ``__import__`` of a literal name, at any depth of the code) and resolved with importlib
  without importing anything. A module is the project's when its source file is under the
  directory its top-level package was found in (the function's module's ``sys.path`` entry)
  and not in the standard library nor a ``site-packages``/``dist-packages`` directory. A
  package's ``__init__.py`` goes with its modules;
- ``f.py``, whose ``f(event)`` imports the function and returns ``function(event)`` (an
  ``async`` function's result is awaited);
- ``requirements.txt``, pinning the installed version (``name==version``) of each
  distribution that provides a third-party top-level module those modules import
  (``importlib.metadata.packages_distributions``); ``requirements=`` (the file's text, or a
  list of lines) replaces it. ``sprout`` itself is never pinned: every sandbox has it.

The lambda is named ``fn-<function name>-<first 12 hex digits of the sha256 of its files>``;
:func:`deploy` asks the worker for it (``GET /registry/<name>``) and uploads it only if it is
not there, once per process and worker.
"""

import ast
import gzip
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import inspect
import io
import keyword
import os
import re
import sys
import sysconfig
import tarfile
import threading
import warnings
import weakref
from dataclasses import dataclass

from sprout.client import SproutError

ENTRY = "f.py"
"""The entry file; ``_sprout_f.py`` (named in an ol.yaml) when the project has a module ``f``."""
MAIN_ALIAS = "_sprout_main"
THIRD_PARTY_DIRS = frozenset({"site-packages", "dist-packages"})
PROVIDED = frozenset({"sprout"})
"""Top-level packages every sandbox has: never shipped nor pinned."""


@dataclass(frozen=True)
class Package:
    """A function packed as a lambda: its ``name`` and ``files`` ({path in the lambda: bytes})."""

    name: str
    files: dict

    def archive(self):
        """The lambda as tar.gz bytes; the same files always make the same bytes."""
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as archive:
            for path in sorted(self.files):
                data = self.files[path]
                info = tarfile.TarInfo(path)
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                archive.addfile(info, io.BytesIO(data))
        out = io.BytesIO()
        with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as compressed:
            compressed.write(raw.getvalue())
        return out.getvalue()


# ---------------------------------------------------------------- the function


def lambda_name(function_name, files):
    """``fn-<function_name sanitised>-<12 hex of the files' sha256>``: at most 64 characters,
    ASCII letters and digits, ``-``, ``_`` and ``.``."""
    digest = hashlib.sha256()
    for path in sorted(files):
        data = files[path]
        digest.update(f"{path}\0{len(data)}\0".encode())
        digest.update(data)
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", function_name)[: 64 - len("fn--") - 12] or "f"
    return f"fn-{stem}-{digest.hexdigest()[:12]}"


def _defined_at_top(tree, name):
    """Whether module ``tree`` binds ``name`` when imported (not only under ``if __name__ ==
    "__main__":``)."""

    def main_guard(node):
        test = node.test
        return (isinstance(node, ast.If) and isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
                and test.left.id == "__name__" and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators))

    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
                return True
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return True
        elif isinstance(node, ast.If) and not main_guard(node):
            stack += node.body + node.orelse
        elif isinstance(node, ast.Try):
            stack += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
        elif isinstance(node, (ast.With, ast.For, ast.While)):
            stack += node.body + getattr(node, "orelse", [])
    return False


def _resolve(module, qualname):
    target = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
    return target


def _function_module(function):
    """(module name to ship it as, its source file, whether a package) of ``function``'s
    module; TypeError when it cannot be imported by name from a source file."""
    qualname, module_name = getattr(function, "__qualname__", None), getattr(function, "__module__", None)
    if inspect.ismethod(function):
        raise TypeError(f"{function!r} is a bound method: sprout.map ships functions (defined at a module's top level)")
    if not callable(function) or not isinstance(qualname, str) or not isinstance(module_name, str):
        raise TypeError(f"{function!r} is not a function: sprout.map ships functions defined in a source file")
    if "<lambda>" in qualname:
        raise TypeError("a lambda expression cannot be shipped: define the function with def at a module's top level")
    if "<locals>" in qualname:
        raise TypeError(f"{qualname} is nested in another function: only functions at a module's top level can be shipped")
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if module is None or not path or not path.endswith(".py") or not os.path.isfile(path):
        raise TypeError(f"{qualname} has no source file to ship (it belongs to module {module_name!r}: built in, defined "
                        "interactively or by exec?): define it in a .py file")
    if _resolve(module, qualname) is not function:
        raise TypeError(f"{qualname} is not what its module {module_name!r} names so: it could not be imported by name")
    if module_name == "__main__":
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.name and spec.name != "__main__":  # python -m package.module
            return spec.name, path, False
        return _main_alias(path), path, False
    return module_name, path, bool(getattr(module, "__path__", None))


def _main_alias(path):
    stem = os.path.splitext(os.path.basename(path))[0]
    if (stem.isidentifier() and stem.isascii() and not keyword.iskeyword(stem) and stem not in ("f", "__main__")
            and stem not in getattr(sys, "stdlib_module_names", ()) and stem not in PROVIDED):
        found = _spec(stem)
        if found is None or (found.origin and os.path.realpath(found.origin) == os.path.realpath(path)):
            return stem
    return MAIN_ALIAS


def _root_of(module_name, path, is_package):
    """The directory module ``module_name`` (file ``path``) was found in: its sys.path entry."""
    root = os.path.realpath(path)
    for _ in range(module_name.count(".") + 1 + is_package):
        root = os.path.dirname(root)
    return root


# ---------------------------------------------------------------- imports


def imports_of(tree, module_name, is_package):
    """Absolute names of the modules ``tree`` (the code of module ``module_name``) may import:
    each ``import a.b``, each ``from a import b`` (``a`` and ``a.b``, which may be a module),
    relative ones resolved against its package, and ``importlib.import_module("a")`` /
    ``__import__("a")`` of a literal name."""
    package = module_name if is_package else module_name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                if node.level - 1 > len(parts) or not package:
                    continue  # beyond the top-level package: would fail at import anyway
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module
            if not base:
                continue
            found.append(base)
            found += [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if called in ("import_module", "__import__") and not node.args[0].value.startswith("."):
                found.append(node.args[0].value)
    return list(dict.fromkeys(found))


def _spec(name):
    """Where module ``name`` would be imported from, without importing anything (a dotted
    name is looked for in its parent package's directories); None if nowhere."""
    parent, _, _ = name.rpartition(".")
    try:
        if not parent:
            if name == "__main__":
                return None
            return importlib.util.find_spec(name)
        above = _spec(parent)
        if above is None or not above.submodule_search_locations:
            return None
        known = sys.modules.get(name)
        if known is not None and getattr(known, "__spec__", None) is not None:
            return known.__spec__
        return importlib.machinery.PathFinder.find_spec(name, list(above.submodule_search_locations))
    except Exception:  # a finder of a package's own may raise anything
        return None


def _stdlib_dirs():
    paths = sysconfig.get_paths()
    return {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if k in paths}


def _under(path, directory):
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def kind_of(top, paths, roots, stdlib_dirs=None):
    """"project", "stdlib" or "third-party": where a module of top-level package ``top``,
    whose files are at ``paths``, belongs. A module's files decide before its name: a
    project's own ``test.py`` is the project's."""
    names = getattr(sys, "stdlib_module_names", ())
    where = [os.path.realpath(p) for p in paths]
    if not where or top in sys.builtin_module_names:
        return "stdlib" if top in names or top in sys.builtin_module_names else "third-party"
    if any(THIRD_PARTY_DIRS.intersection(p.split(os.sep)) for p in where):
        return "third-party"
    stdlib_dirs = _stdlib_dirs() if stdlib_dirs is None else stdlib_dirs
    if all(any(_under(p, d) for d in stdlib_dirs) for p in where):
        return "stdlib"
    if all(any(_under(p, r) for r in roots) for p in where):
        return "project"
    return "stdlib" if top in names else "third-party"


def classify(name, spec, roots, stdlib_dirs=None):
    """Where module ``name``, found at ``spec``, belongs: see :func:`kind_of`."""
    if spec.origin in ("built-in", "frozen"):
        return "stdlib"
    paths = [spec.origin] if spec.has_location and spec.origin else list(spec.submodule_search_locations or [])
    return kind_of(name.partition(".")[0], paths, roots, stdlib_dirs)


def discover(module_name, path, is_package, roots):
    """The project's modules that module ``module_name`` (source ``path``) imports,
    recursively, and itself: ({module name: (source file or None for a namespace package,
    whether a package)}, {top-level names of third-party modules imported})."""
    stdlib_dirs = _stdlib_dirs()
    project = {}
    third_party = set()
    queue = []

    def add(name, origin, package):
        if name not in project:
            project[name] = (origin, package)
            if origin:
                queue.append((name, origin, package))

    parts = module_name.split(".")
    for i in range(1, len(parts)):  # the packages above it run first when it is imported
        parent = ".".join(parts[:i])
        spec = _spec(parent)
        if spec is not None and classify(parent, spec, roots, stdlib_dirs) == "project":
            add(parent, spec.origin if spec.has_location else None, True)
    add(module_name, path, is_package)
    while queue:
        name, origin, package = queue.pop()
        with open(origin, "rb") as f:
            source = f.read()
        try:
            tree = ast.parse(source, origin)
        except SyntaxError as e:
            raise TypeError(f"{origin} cannot be shipped: {e}") from e
        for imported in imports_of(tree, name, package):
            pieces = imported.split(".")
            for i in range(1, len(pieces) + 1):
                candidate = ".".join(pieces[:i])
                if candidate in project:
                    continue
                if pieces[0] in PROVIDED:
                    break
                spec = _spec(candidate)
                if spec is None:
                    break  # not a module (``from a import function``), or not installed here
                kind = classify(candidate, spec, roots, stdlib_dirs)
                if kind == "third-party":
                    third_party.add(pieces[0])
                if kind != "project":
                    break
                origin = spec.origin if spec.has_location else None
                if origin and not origin.endswith(".py"):
                    warnings.warn(f"{candidate} ({origin}) is not Python source: it is not shipped", stacklevel=3)
                    break
                add(candidate, origin, bool(spec.submodule_search_locations))
    return project, third_party


def pins(top_levels):
    """requirements.txt lines pinning the installed distributions that provide the
    top-level modules ``top_levels``; a warning for each that none provides."""
    provided = importlib.metadata.packages_distributions()
    lines = set()
    for top in sorted(top_levels):
        distributions = provided.get(top)
        if not distributions:
            warnings.warn(f"no installed distribution provides module {top!r}: the shipped lambda may fail to import it", stacklevel=3)
            continue
        for distribution in distributions:
            try:
                lines.add(f"{distribution}=={importlib.metadata.version(distribution)}")
            except importlib.metadata.PackageNotFoundError:
                continue
    return sorted(lines, key=str.lower)


# ---------------------------------------------------------------- the lambda


_ENTRY_SOURCE = '''"""Shipped by sprout.map: runs {module}.{qualname} on each event."""
{imports}


def f(event):
    return {call}
'''


def _entry(module_name, qualname, is_async):
    top, _, rest = qualname.partition(".")
    if rest:
        imports = f"import {module_name} as _module\n\n_target = _module.{qualname}"
    else:
        imports = f"from {module_name} import {top} as _target"
    if is_async:
        imports = "import asyncio\n" + imports
    call = "asyncio.run(_target(event))" if is_async else "_target(event)"
    return _ENTRY_SOURCE.format(module=module_name, qualname=qualname, imports=imports, call=call).encode()


def _requirements_text(requirements):
    if isinstance(requirements, (bytes, bytearray)):
        requirements = requirements.decode()
    if not isinstance(requirements, str):
        requirements = "\n".join(str(line).strip() for line in requirements)
    text = requirements.strip()
    return text + "\n" if text else ""


def package(function, requirements=None):
    """``function`` packed as a lambda (see the module's documentation): a :class:`Package`."""
    module_name, path, is_package = _function_module(function)
    with open(path, "rb") as f:
        source = f.read()
    try:
        tree = ast.parse(source, path)
    except SyntaxError as e:
        raise TypeError(f"{path} cannot be shipped: {e}") from e
    top_name = function.__qualname__.partition(".")[0]
    if not _defined_at_top(tree, top_name):
        raise TypeError(f"{function.__qualname__} is not defined at the top level of {path} when imported as a module "
                        "(only under `if __name__ == \"__main__\":`?): move it out")
    files = {}
    roots = [_root_of(module_name, path, is_package)]
    kind = "project" if function.__module__ == "__main__" else kind_of(module_name.partition(".")[0], [path], roots)
    if kind == "project":
        project, third_party = discover(module_name, path, is_package, roots)
        for name, (origin, package_) in project.items():
            if origin is None:
                continue  # a namespace package: a directory, made by its modules' paths
            target = name.replace(".", "/") + ("/__init__.py" if package_ else ".py")
            with open(origin, "rb") as f:
                files[target] = f.read()
    else:  # the standard library's, or an installed distribution's: f.py imports it there
        third_party = {module_name.partition(".")[0]} if kind == "third-party" else set()
    third_party -= PROVIDED
    entry = ENTRY
    if any(p == "f.py" or p.startswith("f/") for p in files):
        entry = "_sprout_f.py"
        files["ol.yaml"] = f"environment:\n  OL_ENTRY_FILE: {entry}\n".encode()
    files[entry] = _entry(module_name, function.__qualname__, inspect.iscoroutinefunction(function))
    text = _requirements_text(pins(third_party) if requirements is None else requirements)
    if text:
        files["requirements.txt"] = text.encode()
    return Package(lambda_name(function.__qualname__.rpartition(".")[2], files), files)


_packed = weakref.WeakKeyDictionary()  # function -> {requirements: Package}
_deployed = set()  # (worker URL, lambda name)
_lock = threading.Lock()


def deploy(function, client, requirements=None):
    """Ship ``function`` to the worker of ``client`` (a :class:`sprout.Client`) unless it is
    there already; returns the lambda's name. Packed and looked up once per process."""
    key = requirements if requirements is None or isinstance(requirements, str) else tuple(requirements)
    with _lock:
        try:
            packed = _packed.setdefault(function, {})
        except TypeError:  # not weakly referable: packed again each time
            packed = {}
        if key not in packed:
            packed[key] = package(function, requirements)
        shipped = packed[key]
    return deploy_package(shipped, client)


def deploy_package(shipped, client):
    """Upload :class:`Package` ``shipped`` to the worker of ``client`` unless it is there
    already (asked once per process); returns the lambda's name."""
    with _lock:
        if (client.url, shipped.name) in _deployed:
            return shipped.name
    try:
        client.get(shipped.name)
    except SproutError as e:
        if e.status != 404:
            raise
        client.upload(shipped.name, shipped.archive())
    with _lock:
        _deployed.add((client.url, shipped.name))
    return shipped.name


def forget(client, name):
    """Forget that lambda ``name`` was deployed to ``client``'s worker: the next
    :func:`deploy` asks it again."""
    with _lock:
        _deployed.discard((client.url, name))
