"""Build small, real wheels for tests: pure-Python packages pip installs offline from a
local wheel directory (the worker's packages.wheel_dir with packages.offline = true)."""

import base64
import hashlib
import io
import zipfile
from pathlib import Path


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def make_wheel(directory, name, version, files, requires=(), top_level=None):
    """Write `<name>-<version>-py3-none-any.whl` into `directory`.

    `files` maps paths inside the wheel (e.g. "alpha/__init__.py") to text or bytes;
    `requires` are Requires-Dist lines. Returns the wheel's path."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    contents = {path: (data.encode() if isinstance(data, str) else data) for path, data in files.items()}
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Requires-Dist: {r}" for r in requires]
    contents[f"{info}/METADATA"] = ("\n".join(metadata) + "\n").encode()
    contents[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: sprout-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    if top_level is not None:
        contents[f"{info}/top_level.txt"] = ("\n".join(top_level) + "\n").encode()
    record = [_record_line(path, data) for path, data in contents.items()]
    record.append(f"{info}/RECORD,,")
    contents[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = Path(directory) / f"{dist}-{version}-py3-none-any.whl"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        for member, data in contents.items():
            wheel.writestr(member, data)
    path.write_bytes(buffer.getvalue())
    return path


def module(name, body="", deps=()):
    """An importable package `name` whose import imports `deps` and runs `body`."""
    lines = [f"import {d}" for d in deps]
    lines.append(f"NAME = {name!r}")
    lines.append(body)
    return {f"{name}/__init__.py": "\n".join(lines) + "\n"}
