"""A lambda's modules are compiled to bytecode at upload (bytecode.rs): its sandboxes import
them from `__pycache__` without reading the sources; a module that does not compile is left
to fail at import, as before, and does not stop the upload."""

from conftest import targz

HANDLER = '''
import sys

opened = []
sys.addaudithook(lambda event, args: opened.append(args[0])
                 if event == "open" and isinstance(args[0], str) and args[0].startswith("/handler/") else None)

def f(event):
    if event == "broken":
        try:
            import helpers.broken  # noqa: F401
        except SyntaxError as e:
            return {"error": "SyntaxError", "line": e.lineno}
        return {"error": None}
    import helpers.shout
    return {"out": helpers.shout.shout("hi"), "opened": list(opened)}
'''


def test_modules_are_imported_from_bytecode_made_at_upload(worker):
    files = {"f.py": HANDLER, "helpers/__init__.py": "", "helpers/shout.py": "def shout(s):\n    return s.upper() + '!'\n",
             "helpers/broken.py": "def oops(:\n", "notes.txt": "not python\n"}
    worker.client.upload("bytecode", targz(files))
    [published] = sorted((worker.dir / "registry").glob("bytecode@*[0-9]"))
    caches = sorted(p.relative_to(published).as_posix() for p in published.rglob("*.pyc"))
    assert [c.split(".")[0] for c in caches] == ["__pycache__/f", "helpers/__pycache__/__init__", "helpers/__pycache__/shout"]

    reply = worker.client.run("bytecode", "go")
    assert reply["out"] == "HI!"
    assert reply["opened"] and all(p.endswith(".pyc") for p in reply["opened"]), reply["opened"]
    assert "/handler/helpers/__pycache__/shout" in " ".join(reply["opened"])

    # The module that does not compile fails where it is imported, as it always did.
    assert worker.client.run("bytecode", "broken") == {"error": "SyntaxError", "line": 1}
    worker.client.delete("bytecode")
