"""Spares: children forked from a Zygote ahead of demand, bound to a lambda on its cold
start. A spare is bound once, so no lambda ever sees another's environment, files, modules
or processes through one; a spare that dies while waiting is skipped; a new package
Zygote is a spare of its parent when one is ready; with `spares = 0` every cold start forks
on demand. The sizing policy is unit-tested on synthetic arrivals
(crates/sandbox/src/import_cache/spares.rs)."""

import os
import signal
import time

from conftest import deploy_with, offline, probe, zygote_nodes

# Each lambda marks everything a reused process would carry over, then reports what of
# the other lambda's marks it can see.
MARKING = """
import builtins
import os
import sys

import {own}_module

def f(event):
    seen = {{
        "pid": os.getpid(),
        "env": os.environ.get("{other}_SECRET"),
        "file": os.path.exists("/tmp/{other}-was-here"),
        "module": "{other}_module" in sys.modules,
        "builtin": hasattr(builtins, "{other}_marker"),
        "handler_files": sorted(os.listdir("/handler")),
        "own_env": os.environ.get("{own}_SECRET"),
    }}
    open("/tmp/{own}-was-here", "w").write("x")
    setattr(builtins, "{own}_marker", True)
    return seen
"""


def deploy_marking(worker, own, other):
    files = {f"{own}_module.py": "VALUE = 1\n", "ol.yaml": f"environment:\n  {own}_SECRET: {own}-only\n"}
    worker.deploy_source(own, MARKING.format(own=own, other=other), **files)


def spares(worker):
    cache = worker.client.stats()["import_cache"]
    return {k: v for k, v in cache.items() if k.startswith("spares")}


def wait_for(predicate, what, seconds=10):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_bound_spare_carries_no_other_lambdas_environment_files_modules_or_processes(make_worker):
    w = make_worker(instances={"keep_warm": False})
    deploy_marking(w, "alpha", "beta")
    deploy_marking(w, "beta", "alpha")
    for i in range(30):
        own, other = ("alpha", "beta") if i % 2 == 0 else ("beta", "alpha")
        seen = w.client.run(own)
        assert seen["pid"] == 1, "a handler is PID 1 of a namespace of its own"
        assert seen["own_env"] == f"{own}-only"
        assert seen["env"] is None and not seen["file"] and not seen["module"] and not seen["builtin"], seen
        assert seen["handler_files"] == sorted([".env", "__pycache__", "f.py", "ol.yaml", f"{own}_module.py"])  # bytecode from upload
        time.sleep(0.02)  # CPU time for the spares to warm up in
    figures = spares(w)
    # The path under test was taken (else this test would prove nothing).
    assert figures["spares_bound"] >= 10, figures
    assert figures["spares_max"] == 4


def test_a_spare_that_died_waiting_is_skipped_and_replaced(make_worker):
    w = make_worker(instances={"keep_warm": False})
    w.deploy_source("noop", "def f(event):\n    return 'ok'\n")
    assert w.client.run("noop") == "ok"
    wait_for(lambda: spares(w)["spares_ready"] >= 1, "the root Zygote keeps a spare")
    procs = f"/sys/fs/cgroup/pids/{w.cgroup_names[0]}/spares/cgroup.procs"
    pids = [int(p) for p in open(procs).read().split()]
    assert pids, "spares wait in their own cgroup"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: open(procs).read().split() == [], "the killed spares exit")
    before = spares(w)
    assert w.client.run("noop") == "ok"  # served by a fork on demand, or a new spare
    after = spares(w)
    assert after["spares_lost"] + after["spares_bound"] > before["spares_lost"] + before["spares_bound"]
    wait_for(lambda: spares(w)["spares_ready"] >= 1, "a replacement spare is forked")
    assert w.client.run("noop") == "ok"


def test_spares_warm_up_in_an_idle_cgroup_holding_their_memory(make_worker):
    w = make_worker(instances={"keep_warm": False})
    w.deploy_source("noop", "def f(event):\n    return 'ok'\n")
    w.client.run("noop")
    wait_for(lambda: spares(w)["spares_ready"] >= 1, "the root Zygote keeps a spare")
    idle = f"/sys/fs/cgroup/cpu/{w.cgroup_names[0]}/spares/cpu.idle"
    if os.path.exists(idle):
        assert open(idle).read().strip() == "1"
    else:
        assert open(idle.replace("cpu.idle", "cpu.shares")).read().strip() == "2"
    wait_for(lambda: spares(w)["spares_memory_mb"] > 0, "their memory is charged to their cgroup")


def test_with_no_spares_every_cold_start_forks_on_demand(make_worker):
    w = make_worker(sandbox={"spares": 0}, instances={"keep_warm": False})
    w.deploy_source("noop", "def f(event):\n    return 'ok'\n")
    for _ in range(5):
        assert w.client.run("noop") == "ok"
    figures = spares(w)
    assert figures["spares_forked"] == 0 and figures["spares_bound"] == 0 and figures["spares_ready"] == 0


def test_a_new_package_zygote_is_a_spare_of_its_parent_when_one_is_ready(make_worker, wheel_dir):
    w = make_worker(**offline(wheel_dir, instances={"keep_warm": False}))
    w.deploy_source("noop", "def f(event):\n    return 'ok'\n")
    assert w.client.run("noop") == "ok"
    wait_for(lambda: spares(w)["spares_ready"] >= 1, "the root Zygote keeps a spare")
    deploy_with(w, "b", probe(["beta"]), "beta==1.0\n")
    before = spares(w)
    assert w.client.run("b")["preloaded"] == ["beta"]
    after = spares(w)
    # The Zygote was the root's spare; its own first handler found no spare of it yet.
    assert after["spares_bound"] == before["spares_bound"] + 1, (before, after)
    assert after["spares_missed"] == before["spares_missed"] + 1, (before, after)
    stats = w.client.stats()
    (node,) = [n for n in zygote_nodes(stats) if n["adds"] == ["beta==1.0"]]
    pid = int(open(f"/sys/fs/cgroup/pids/{w.cgroup_names[0]}/zygote-{node['id']}/cgroup.procs").read().split()[0])
    spare_pids = open(f"/sys/fs/cgroup/pids/{w.cgroup_names[0]}/spares/cgroup.procs").read().split()
    assert str(pid) not in spare_pids, "the Zygote left the spares' cgroup for its own"
    for _ in range(3):
        assert w.client.run("b")["preloaded"] == ["beta"]
    assert w.client.stats()["import_cache"]["import_cache_hits"] >= 3
