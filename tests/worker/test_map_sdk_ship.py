"""Shipping Python functions as lambdas (python/sprout/ship.py), as `sprout.map` does.

Module discovery and packing without a worker, then maps of shipped functions over a real
worker (deployed once, with their pinned packages)."""

import hashlib
import json
import subprocess
import sys
import textwrap
import zipfile

import pytest

import sprout
from conftest import offline
from sprout import ship

# ---------------------------------------------------------------- shipping, without a worker


def write_project(root, files):
    for path, source in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(source))


PROJECT = {
    "scoring.py": """
        import json
        import os.path

        import helpers
        from pkg import sub

        def score(x):
            import pkg.lazy  # an import inside a function counts too
            return helpers.double(x) + sub.ONE + pkg.lazy.ZERO

        async def ascore(x):
            return x + 100

        class Scorer:
            @staticmethod
            def triple(x):
                return 3 * x

            def plain(self, x):
                return x

        if __name__ == "__main__":
            import unused_here
    """,
    # tabnanny: a project's module named like one of the standard library's is the project's.
    "helpers.py": "import importlib\nimport tabnanny\nBASE = importlib.import_module('consts').BASE + tabnanny.ZERO\n\n"
                  "def double(x):\n    return 2 * x + BASE\n",
    "tabnanny.py": "ZERO = 0\n",
    "consts.py": "BASE = 0\n",
    "pkg/__init__.py": "from .sub import ONE\n",
    "pkg/sub.py": "from . import deep\nONE = 1\n",
    "pkg/deep.py": "",
    "pkg/lazy.py": "ZERO = 0\n",
    "unrelated.py": "raise RuntimeError('never imported')\n",
}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A small project on sys.path: returns its directory and a function importing its
    modules (forgotten afterwards). What was shipped before is forgotten too."""
    monkeypatch.setattr(ship, "_deployed", set())
    monkeypatch.setattr(ship, "_packed", ship.weakref.WeakKeyDictionary())
    root = tmp_path / "proj"
    write_project(root, PROJECT)
    monkeypatch.syspath_prepend(str(root))
    loaded = []

    def load(name):
        import importlib

        loaded.append(name)
        return importlib.import_module(name)

    yield root, load
    ours = {"scoring", "helpers", "consts", "pkg", "unrelated", "ffunc", "f", "uses_gamma", "tabnanny", *loaded}
    for name in list(sys.modules):
        if name.split(".")[0] in ours:
            del sys.modules[name]


def test_imports_are_read_with_ast():
    import ast

    tree = ast.parse(textwrap.dedent("""
        import a.b, c as d
        from e import f, g
        from . import h
        from ..i import j
        from .k import *
        import importlib
        importlib.import_module("l.m")
        __import__("n")
        def inner():
            import o
    """))
    assert ship.imports_of(tree, "top.pkg.mod", False) == ["a.b", "c", "e", "e.f", "e.g", "top.pkg", "top.pkg.h", "top.i", "top.i.j",
                                                         "top.pkg.k", "importlib", "l.m", "n", "o"]
    assert ship.imports_of(ast.parse("from . import x"), "top", True) == ["top", "top.x"]
    assert ship.imports_of(ast.parse("from .. import x"), "script", False) == []


def test_a_function_ships_with_the_project_modules_it_imports(project):
    root, load = project
    scoring = load("scoring")
    packed = ship.package(scoring.score)
    assert sorted(packed.files) == ["consts.py", "f.py", "helpers.py", "pkg/__init__.py", "pkg/deep.py", "pkg/lazy.py", "pkg/sub.py",
                                    "scoring.py", "tabnanny.py"]
    assert packed.files["helpers.py"] == (root / "helpers.py").read_bytes()
    assert "requirements.txt" not in packed.files  # json, os.path: the standard library
    assert packed.name.startswith("fn-score-") and len(packed.name) == len("fn-score-") + 12
    # The same files, the same name and archive; the archive holds exactly them.
    assert ship.package(scoring.score) == packed and ship.package(scoring.score).archive() == packed.archive()
    run_locally(packed, root.parent / "unpacked", [5, 6], [11, 13])


def run_locally(packed, directory, events, expected):
    """Unpack the lambda and call its f.py's f on each event in a fresh Python."""
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(packed.archive())) as archive:
        archive.extractall(directory, filter="data")
    entry = "_sprout_f" if (directory / "_sprout_f.py").exists() else "f"
    code = f"import json, {entry}; print(json.dumps([{entry}.f(e) for e in {events!r}]))"
    out = subprocess.run([sys.executable, "-c", code], cwd=directory, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == expected


def test_methods_async_functions_and_what_cannot_be_shipped(project, tmp_path):
    _, load = project
    scoring = load("scoring")
    run_locally(ship.package(scoring.Scorer.triple), tmp_path / "triple", [2], [6])
    run_locally(ship.package(scoring.ascore), tmp_path / "async", [1], [101])
    with pytest.raises(TypeError, match="lambda expression"):
        ship.package(lambda x: x)

    def nested(x):
        return x

    with pytest.raises(TypeError, match="nested"):
        ship.package(nested)
    namespace = {"__name__": "made_by_exec"}
    exec("def g(x):\n    return x\n", namespace)
    with pytest.raises(TypeError, match="no source file"):
        ship.package(namespace["g"])
    with pytest.raises(TypeError, match="no source file"):
        ship.package(len)
    with pytest.raises(TypeError, match="bound method"):
        ship.package(scoring.Scorer().plain)


def test_stdlib_and_installed_functions_ship_only_their_entry(tmp_path):
    import posixpath

    packed = ship.package(posixpath.basename)
    assert sorted(packed.files) == ["f.py"]
    run_locally(packed, tmp_path / "basename", ["/a/b"], ["b"])


def test_third_party_imports_are_pinned(project, tmp_path, monkeypatch, wheel_dir):
    root, load = project
    # gamma 1.0 "installed" in a site-packages directory (even one inside the project).
    site = root / "venv" / "site-packages"
    with zipfile.ZipFile(wheel_dir / "gamma-1.0-py3-none-any.whl") as wheel:
        wheel.extractall(site)
    monkeypatch.syspath_prepend(str(site))
    write_project(root, {"uses_gamma.py": "import gamma\nimport sprout\n\ndef g(x):\n    return [gamma.NAME, x]\n"})
    module = load("uses_gamma")
    packed = ship.package(module.g)
    assert sorted(packed.files) == ["f.py", "requirements.txt", "uses_gamma.py"]
    assert packed.files["requirements.txt"] == b"gamma==1.0\n"
    assert ship.package(module.g, requirements=["gamma==1.0", "beta==2.0"]).files["requirements.txt"] == b"gamma==1.0\nbeta==2.0\n"
    assert "requirements.txt" not in ship.package(module.g, requirements="").files
    sys.modules.pop("gamma", None)


def test_a_project_module_named_f_moves_the_entry(project):
    root, load = project
    write_project(root, {"f.py": "def helper(x):\n    return x - 1\n", "ffunc.py": "import f\n\ndef g(x):\n    return f.helper(x)\n"})
    packed = ship.package(load("ffunc").g)
    assert sorted(packed.files) == ["_sprout_f.py", "f.py", "ffunc.py", "ol.yaml"]
    assert packed.files["ol.yaml"] == b"environment:\n  OL_ENTRY_FILE: _sprout_f.py\n"
    run_locally(packed, root.parent / "unpacked", [10], [9])


def test_names_are_made_of_the_function_and_its_files():
    name = ship.lambda_name("größe_" + "x" * 100, {"f.py": b"1"})
    assert len(name) == 64 and name.startswith("fn-gr__e_xxx") and name.isascii()
    assert ship.lambda_name("a", {"f.py": b"1"}) != ship.lambda_name("a", {"f.py": b"2"})
    assert ship.lambda_name("a", {"f.py": b"1"}) != ship.lambda_name("a", {"g.py": b"1"})


def test_a_scripts_function_ships_without_its_main_block(tmp_path):
    root = tmp_path / "app"
    write_project(root, {
        "job.py": """
            import helpers

            def work(x):
                return helpers.add_one(x)

            if __name__ == "__main__":
                import sprout.ship

                def only_here(x):
                    return x
                packed = sprout.ship.package(work)
                try:
                    sprout.ship.package(only_here)
                except TypeError as e:
                    refused = str(e)
                import json
                print(json.dumps({"files": {k: v.decode() for k, v in packed.files.items()}, "refused": refused}))
        """,
        "helpers.py": "def add_one(x):\n    return x + 1\n",
    })
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(sprout.__path__[0] + "/.."), "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([sys.executable, str(root / "job.py")], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    files = result["files"]
    assert sorted(files) == ["f.py", "helpers.py", "job.py"]
    assert "from job import work" in files["f.py"]
    assert "under `if __name__" in result["refused"]
    # Imported as `job`, its main block does not run.
    packed = ship.Package("x", {k: v.encode() for k, v in files.items()})
    run_locally(packed, tmp_path / "unpacked", [1], [2])


# ---------------------------------------------------------------- against a real worker (installing from the test wheels)


def test_a_function_is_shipped_with_its_helper_and_deployed_once(make_worker, wheel_dir, project, monkeypatch):
    w = make_worker(**offline(wheel_dir))
    root, load = project
    scoring = load("scoring")
    client = sprout.Client(w.url, timeout=60)
    calls = []
    for method in ("get", "upload"):
        real = getattr(client, method)
        monkeypatch.setattr(client, method, lambda *a, _m=method, _r=real: calls.append(_m) or _r(*a))
    assert list(sprout.map(scoring.score, range(50), client=client)) == [2 * i + 1 for i in range(50)]
    packed = ship.package(scoring.score)
    meta = w.client.get(packed.name)
    assert meta["files"] == len(packed.files) == 9
    assert meta["sha256"] == hashlib.sha256(packed.archive()).hexdigest()
    assert calls == ["get", "upload"]
    # Again: packed and deployed already in this process.
    assert list(sprout.map(scoring.score, [3], client=client)) == [7]
    assert calls == ["get", "upload"]
    # Another process (the memo forgotten) finds it on the worker and does not upload it.
    monkeypatch.setattr(ship, "_deployed", set())
    monkeypatch.setattr(ship, "_packed", ship.weakref.WeakKeyDictionary())
    assert list(sprout.map(scoring.score, [4], client=client)) == [9]
    assert calls == ["get", "upload", "get"] and w.client.get(packed.name)["version"] == meta["version"]


def test_a_shipped_function_gets_its_pinned_packages(make_worker, project, monkeypatch, wheel_dir):
    w = make_worker(**offline(wheel_dir))
    root, load = project
    site = root / "site-packages"
    with zipfile.ZipFile(wheel_dir / "gamma-1.0-py3-none-any.whl") as wheel:
        wheel.extractall(site)
    monkeypatch.syspath_prepend(str(site))
    write_project(root, {"uses_gamma.py": "import gamma\n\ndef g(x):\n    return [gamma.NAME, x]\n"})
    module = load("uses_gamma")
    assert list(sprout.map(module.g, ["a", "b"], client=w.client)) == [["gamma", "a"], ["gamma", "b"]]
    assert w.client.get(ship.package(module.g).name)["requirements"] == ["gamma==1.0"]
    sys.modules.pop("gamma", None)
