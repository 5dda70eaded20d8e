"""Confine a deployment to a set of CPUs: a cpuset cgroup holding all its processes, or affinity.

Every process of the deployment, and everything it starts, lives in the cgroup; where no
cpuset controller can be had, CPU affinity stands in.

Three mechanisms, the first available wins:

- cgroup v1: a group in the cpuset hierarchy (/sys/fs/cgroup/cpuset/sprout-olio-<id>). The
  Sprout worker's own cgroups use other v1 controllers (memory, pids, cpu, freezer), so its
  sandboxes stay in this cpuset group.
- cgroup v2, when the unified hierarchy offers the cpuset controller: a group C with the
  controller on, processes in its leaf C/main (v2 forbids processes in a group whose
  controllers its children use). The Sprout worker is told to make its cgroups under C
  (`cgroups.v2_root`), so sandboxes stay under C's cpuset too.
- sched_setaffinity (what `taskset` does), inherited by every child. A warning says so: a
  process may widen its own affinity again, and nothing lists the deployment's processes.

A process joins in a `preexec_fn` (`enter`), before it execs its program; its descendants
inherit the group (or the mask).
"""

import hashlib
import os
import signal
import sys
import time
from pathlib import Path

from .procs import DeployError, alive

PREFIX = "olio-deploy-"


def online_cpus():
    return parse_cpus(Path("/sys/devices/system/cpu/online").read_text().strip(), check=False)


def parse_cpus(text, check=True):
    """"0", "0,2" or "0-3" -> [0, ...]; refuses CPUs this machine does not have."""
    cpus = set()
    try:
        for part in filter(None, (p.strip() for p in str(text).split(","))):
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise DeployError(f"--cpus {text!r}: use a CPU list such as 0, 0,1 or 0-3") from None
    if not cpus:
        raise DeployError("--cpus: name at least one CPU")
    if check:
        missing = sorted(cpus - set(online_cpus()))
        if missing:
            raise DeployError(f"--cpus {text}: no CPU {', '.join(map(str, missing))} here (online: {format_cpus(online_cpus())})")
    return sorted(cpus)


def format_cpus(cpus):
    """[0, 1, 2, 5] -> "0-2,5" (the kernel's list format)."""
    ranges, cpus = [], sorted(cpus)
    start = prev = cpus[0]
    for cpu in cpus[1:] + [None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        ranges.append(f"{start}-{prev}" if prev != start else f"{start}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(ranges)


def group_name(state_dir):
    digest = hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()[:10]
    return PREFIX + digest


def _mounts():
    """[(mount point, fstype, super options)] from /proc/self/mountinfo."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) >= 5 and len(rfields) >= 3:
                found.append((fields[4].replace("\\040", " "), rfields[0], rfields[2].split(",")))
    return found


def detect():
    """("v1", cpuset mount) or ("v2", unified root) or ("affinity", None)."""
    mounts = _mounts()
    for point, fstype, options in mounts:
        if fstype == "cgroup" and "cpuset" in options:
            return "v1", Path(point)
    for point, fstype, _ in mounts:
        if fstype == "cgroup2":
            try:
                if "cpuset" in (Path(point) / "cgroup.controllers").read_text().split():
                    return "v2", Path(point)
            except OSError:
                pass
    return "affinity", None


def _write(path, text):
    try:
        Path(path).write_text(text)
    except OSError as e:
        raise DeployError(f"writing {text.strip()!r} to {path}: {e.strerror}") from None


class Confinement:
    """The CPUs of one deployment, and the cgroup holding its processes (if any)."""

    def __init__(self, name, cpus, kind, root):
        self.name, self.cpus, self.kind, self.root = name, list(cpus), kind, root
        self.group = root / name if root else None

    @classmethod
    def create(cls, name, cpus, warn=None):
        kind, root = detect()
        confinement = cls(name, cpus, kind, root)
        if kind == "v1":
            confinement._make_v1()
        elif kind == "v2":
            confinement._make_v2()
        else:
            (warn or _stderr)(f"warning: no cpuset cgroup controller here; confining to CPUs {format_cpus(cpus)} with "
                              "sched_setaffinity only (a process may widen its own affinity, and stray processes are not tracked)")
        return confinement

    @classmethod
    def existing(cls, name, cpus):
        """The confinement `name` as `create` left it (for down and status)."""
        kind, root = detect()
        return cls(name, cpus, kind, root)

    def _make_v1(self):
        self.group.mkdir(exist_ok=True)
        # A v1 cpuset group takes no task until both its CPUs and its memory nodes are set.
        _write(self.group / "cpuset.mems", (self.root / "cpuset.mems").read_text())
        _write(self.group / "cpuset.cpus", format_cpus(self.cpus))

    def _make_v2(self):
        enabled = (self.root / "cgroup.subtree_control").read_text().split()
        available = (self.root / "cgroup.controllers").read_text().split()
        # cpuset for the confinement; memory, pids and cpu so the worker can use them below it.
        wanted = [c for c in ("cpuset", "memory", "pids", "cpu") if c in available and c not in enabled]
        if wanted:
            _write(self.root / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
        self.group.mkdir(exist_ok=True)
        _write(self.group / "cpuset.cpus", format_cpus(self.cpus))
        _write(self.group / "cgroup.subtree_control", "+cpuset")
        (self.group / "main").mkdir(exist_ok=True)

    @property
    def procs_file(self):
        if self.kind == "v1":
            return self.group / "cgroup.procs"
        if self.kind == "v2":
            return self.group / "main" / "cgroup.procs"
        return None

    @property
    def worker_v2_root(self):
        """Where a Sprout worker must make its cgroups to stay inside (v2 only)."""
        return self.group if self.kind == "v2" else None

    def enter(self):
        """Join the confinement; call in a child before exec (a preexec_fn)."""
        if self.procs_file is not None:
            with open(self.procs_file, "w") as f:
                f.write("0")
        os.sched_setaffinity(0, self.cpus)

    def exists(self):
        return self.group is not None and self.group.is_dir()

    def pids(self):
        """Every process in the group and its sub-groups; None without a cgroup."""
        if self.group is None:
            return None
        found = set()
        if self.group.is_dir():
            for procs in self.group.rglob("cgroup.procs"):
                try:
                    found.update(int(p) for p in procs.read_text().split())
                except OSError:
                    pass
        return sorted(found)

    def destroy(self, grace=10.0):
        """Stop whatever is still inside (SIGTERM, then SIGKILL) and remove the group.
        Returns the pids that had to be stopped."""
        if not self.exists():
            return []
        settle = time.monotonic() + 3  # what was just stopped may take a moment to exit
        while any(alive(p) for p in self.pids()) and time.monotonic() < settle:
            time.sleep(0.05)
        strays = [f"{p} ({_command(p)})" for p in self.pids() if alive(p)]
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            for pid in self.pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while any(alive(p) for p in self.pids()) and time.monotonic() < deadline:
                time.sleep(0.05)
        for group in sorted((p for p in self.group.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [self.group]:
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)  # the last tasks are leaving
            else:
                raise DeployError(f"cannot remove the cgroup {group}: processes {self.pids()} remain")
        return strays

    def describe(self):
        return {"cpus": format_cpus(self.cpus), "mechanism": {"v1": "cgroup v1 cpuset", "v2": "cgroup v2 cpuset",
                                                              "affinity": "sched_setaffinity"}[self.kind],
                "cgroup": str(self.group) if self.group else None}


def _command(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:80]
    except OSError:
        return "?"


def _stderr(message):
    print(message, file=sys.stderr)
