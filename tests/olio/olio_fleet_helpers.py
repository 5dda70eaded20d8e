"""Helpers of the Olio fleet tests: a fleet file, `sprout olio`, and the processes under a cgroup."""

import json
import os
import subprocess
from pathlib import Path

from conftest import ROOT, SPROUT

PYTHONPATH = f"{ROOT / 'python'}:{ROOT / 'apps' / 'olio'}"


def fleet_file(path, sites, users=20):
    path.write_text(json.dumps({
        "version": 1, "seed": 3, "span_s": 300.0, "registered_users": users,
        "sites": [{"name": name, "host": host, "rate_per_day": 100.0, "trigger": "bursty", "sessions": 1,
                   "peak_users": 1, "mean_users": 0.1, "profile": [[0.0, 0], [10.0, 1], [20.0, 0]]} for name, host in sites],
    }))
    return path


def olio(*args, timeout=600):
    return subprocess.run([str(SPROUT), "olio", *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": PYTHONPATH})


def host(name):
    return f"{name}.fleet.test"


def command(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def cgroup_of(pid):
    """/proc/PID/cgroup, or "" for a process that has ended (sandboxes and database backends
    come and go while a test looks)."""
    try:
        return Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return ""


def cgroup_pids(cgroup):
    """Every process in `cgroup` and the groups below it."""
    found = set()
    for procs_file in Path(cgroup).rglob("cgroup.procs"):
        found |= {int(p) for p in procs_file.read_text().split()}
    return found
