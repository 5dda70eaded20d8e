"""Tries the volumes its event names: writes a file into one, reads one, tries to write
where it may not, plants links; reports what happened (errno for each failure)."""

import os


def attempt(action):
    try:
        return {"ok": action()}
    except OSError as exc:
        return {"errno": exc.errno}


def f(event):
    out = {"uid": os.getuid()}
    for path, data in event.get("write", {}).items():
        def write(path=path, data=data):
            with open(path, "w") as file:
                file.write(data)
            return True
        out["write " + path] = attempt(write)
    for path in event.get("read", []):
        out["read " + path] = attempt(lambda path=path: open(path).read())
    for path, target in event.get("link", {}).items():
        out["link " + path] = attempt(lambda path=path, target=target: os.symlink(target, path) or True)
    for path in event.get("list", []):
        out["list " + path] = attempt(lambda path=path: sorted(os.listdir(path)))
    if event.get("import"):
        __import__(event["import"])
        out["imported"] = event["import"]
    return out
