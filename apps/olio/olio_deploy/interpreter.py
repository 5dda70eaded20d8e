"""Which CPython build a stack runs: asked of the interpreter, and read from its running processes.

A build is identified by the SHA-256 of the executable and of the libpython it maps, if any
(Debian's python3.11 links libpython statically; a from-source build with --enable-shared
maps libpython3.11.so). `describe` asks an interpreter for its version, configure flags and
Debian package; `of_processes` hashes what every Python process of a deployment really runs."""

import hashlib
import json
import os
import subprocess
from pathlib import Path

# Run by the interpreter being described; prints one JSON object.
PROBE = r"""
import json, os, platform, sys, sysconfig
v = sysconfig.get_config_var
args = v("CONFIG_ARGS") or ""
lib = None
try:
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split(None, 5)[-1].strip()
            if "/libpython" in path:
                lib = path
                break
except OSError:  # no /proc (a chroot): the caller reads the executable's dependencies instead
    lib = "?"
print(json.dumps({
    "executable": os.path.realpath(sys.executable),
    "version": platform.python_version(),
    "implementation": platform.python_implementation(),
    "build": " ".join(platform.python_build()),
    "compiler": platform.python_compiler(),
    "config_args": [a.strip("'") for a in args.split()
                    if a.strip("'").startswith(("--enable", "--with-lto", "--with-pgo", "--with-computed"))],
    "opt": v("OPT"),
    "libpython": lib,
    "libdir": v("LIBDIR"),
    "venv": sys.prefix if sys.prefix != sys.base_prefix else None,
}))
"""


def sha256_file(path, cache={}):  # noqa: B006 (a per-process cache, keyed by the file's identity)
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in cache:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        cache[key] = h.hexdigest()
    return cache[key]


def _needed_libpython(executable, libdir):
    """libdir/libpython... when the executable links libpython dynamically (readelf -d), else None."""
    out = subprocess.run(["readelf", "-d", executable], capture_output=True, text=True, timeout=30)
    if out.returncode:
        raise RuntimeError(f"readelf -d {executable}: {out.stderr.strip()}")
    for line in out.stdout.splitlines():
        if "(NEEDED)" in line and "[libpython" in line:
            return f"{libdir}/{line.rsplit('[', 1)[1].rstrip(']')}"
    return None


def _package(path):
    """'python3.11-minimal 3.11.2-6+deb12u8' when a Debian package owns `path`, else None."""
    try:
        owner = subprocess.run(["dpkg-query", "-S", path], capture_output=True, text=True, timeout=30)
        if owner.returncode:
            return None
        name = owner.stdout.split(":", 1)[0].strip()
        version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", name], capture_output=True, text=True, timeout=30)
        return f"{name} {version.stdout.strip()}" if version.returncode == 0 else name
    except (OSError, subprocess.SubprocessError):
        return None


def describe(python, root=None):
    """What `python` is (run inside chroot `root` when given): version, configure flags, its
    package, and the build's identity (the hashes of executable and libpython)."""
    argv = ["chroot", str(root), python] if root else [python]
    out = subprocess.run([*argv, "-I", "-c", PROBE], capture_output=True, text=True, timeout=60)
    if out.returncode:
        raise RuntimeError(f"{' '.join(argv)} did not describe itself: {out.stderr.strip()[-500:]}")
    info = json.loads(out.stdout)
    outside = (lambda p: str(Path(root) / p.lstrip("/"))) if root else (lambda p: p)
    info["root"] = str(root) if root else None
    if info["libpython"] == "?":
        info["libpython"] = _needed_libpython(outside(info["executable"]), info["libdir"])
    info["sha256"] = sha256_file(outside(info["executable"]))
    info["libpython_sha256"] = sha256_file(outside(info["libpython"])) if info["libpython"] else None
    info["package"] = _package(info["executable"]) if not root else _base_package(root, info["executable"])
    info["identity"] = identity(info["sha256"], info["libpython_sha256"])
    return info


def _base_package(root, executable):
    """The Debian package and version owning `executable` in a base image (from its dpkg files)."""
    info = Path(root) / "var/lib/dpkg/info"
    for lst in info.glob("*.list"):
        if executable in lst.read_text().split("\n"):
            name = lst.stem.split(":", 1)[0]
            status = (Path(root) / "var/lib/dpkg/status").read_text()
            for block in status.split("\n\n"):
                if f"Package: {name}\n" in block + "\n":
                    version = next((ln[9:] for ln in block.splitlines() if ln.startswith("Version: ")), "")
                    return f"{name} {version}".strip()
            return name
    return None


def identity(exe_sha, lib_sha):
    """One string naming a build: the executable's hash, and libpython's when it has one."""
    return exe_sha[:16] + (f"+{lib_sha[:16]}" if lib_sha else "")


def of_processes(pids):
    """{identity: count} over the Python processes among `pids` (processes gone meanwhile skipped)."""
    found = {}
    for pid in pids:
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
            if not Path(exe.removesuffix(" (deleted)")).name.startswith("python"):
                continue
            exe_sha = sha256_file(f"/proc/{pid}/exe")
            lib_sha = None
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    fields = line.split(None, 5)
                    if len(fields) == 6 and "/libpython" in fields[5]:
                        lib_sha = sha256_file(f"/proc/{pid}/map_files/{fields[0]}")
                        break
        except OSError:
            continue
        key = identity(exe_sha, lib_sha)
        found[key] = found.get(key, 0) + 1
    return found


def report(info, pids):
    """The deployment's record: the interpreter as described, and what its processes run."""
    running = of_processes(pids)
    return {
        "executable": info["executable"], "root": info["root"], "venv": info["venv"], "version": info["version"],
        "build": info["build"], "compiler": info["compiler"], "config_args": info["config_args"], "opt": info["opt"],
        "libpython": info["libpython"], "package": info["package"], "identity": info["identity"],
        "processes": running, "processes_match": bool(running) and set(running) == {info["identity"]},
    }


def summary(record):
    """One line for logs and reports."""
    if not record or "error" in record:
        return f"unknown ({record['error']})" if record else "unknown"
    where = f"{record['executable']}" + (f" in {record['root']}" if record.get("root") else "")
    where += f", venv {record['venv']}" if record.get("venv") else ""
    pkg = f", {record['package']}" if record.get("package") else ""
    lib = "libpython shared" if record.get("libpython") else "libpython static"
    return f"CPython {record['version']} ({where}{pkg}; {lib}; build {record['identity']})"
