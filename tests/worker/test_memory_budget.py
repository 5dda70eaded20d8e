"""The whole worker's memory budget: the cgroup holding every sandbox, Zygote and spare is
limited to it, and cold starts are admitted below it, evicting idle sandboxes (most memory
per recent request first) and waiting for busy ones, so a burst of cold starts neither fails
nor makes the kernel kill anything. The admission rule is unit-tested on synthetic figures
(crates/worker/src/budget.rs)."""

import concurrent.futures
import os
import subprocess

import pytest

BUDGET_MB = 160
HOLDING = """
HELD = bytearray({mb} << 20)
for i in range(0, len(HELD), 4096):
    HELD[i] = 1  # touched: really charged to the sandbox

def f(event):
    return len(HELD) >> 20
"""


def memory_dir(worker):
    v1 = f"/sys/fs/cgroup/memory/{worker.cgroup_names[0]}"
    return v1 if os.path.isdir(v1) else f"/sys/fs/cgroup/unified/{worker.cgroup_names[0]}"


def oom_kills(worker):
    d = memory_dir(worker)
    for name in ("memory.oom_control", "memory.events"):
        path = os.path.join(d, name)
        if os.path.exists(path):
            for line in open(path):
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return 0


def limit_bytes(worker):
    d = memory_dir(worker)
    for name in ("memory.limit_in_bytes", "memory.max"):
        path = os.path.join(d, name)
        if os.path.exists(path):
            return int(open(path).read())
    raise AssertionError("no memory limit file")


def test_a_burst_of_cold_starts_fits_the_budget_evicting_and_waiting_but_failing_none(make_worker):
    w = make_worker(instances={"memory_budget_mb": BUDGET_MB})
    assert limit_bytes(w) == BUDGET_MB << 20, "the budget is the cgroup's limit"
    names = [f"holder{i}" for i in range(12)]
    for name in names:
        w.deploy_source(name, HOLDING.format(mb=12))
    # Twelve lambdas of 12 MiB each, twice over, at once: 288 MiB asked of 160.
    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        results = list(pool.map(lambda n: w.client.run(n), names * 2))
    assert results == [12] * 24
    # Again one after another: each cold start now evicts idle sandboxes of the others.
    for name in names:
        assert w.client.run(name) == 12
    stats = w.client.stats()
    budget = stats["lambdas"]["memory_budget"]
    assert budget["limit_mb"] == BUDGET_MB
    assert budget["evictions"] + budget["waits"] > 0, budget  # the budget acted
    assert budget["used_mb"] <= BUDGET_MB
    assert oom_kills(w) == 0, "the kernel never had to kill inside the budget"
    per_lambda = stats["lambdas"]["per_lambda"]
    measured = [v["memory_estimate_mb"] for v in per_lambda.values()]
    assert measured and all(10 <= m <= 32 for m in measured), measured
    metrics = w.client.metrics()
    assert f"sprout_memory_budget_bytes {BUDGET_MB << 20}" in metrics
    assert 'sprout_handler_cache_evictions_total{reason="budget"}' in metrics
    assert 'sprout_lambda_memory_estimate_bytes{lambda="holder' in metrics


SLOW = """
import time
HELD = bytearray(8 << 20)
for i in range(0, len(HELD), 4096):
    HELD[i] = 1

def f(event):
    time.sleep(0.4)
    return "done"
"""


def fill_until_a_sandbox_of(w, name):
    """Evicting to fit a cold start can leave more room than the next one needs: top the
    budget up with idle fillers sized to the room left until another sandbox of `name`
    would not fit without evicting."""
    for i in range(8):
        stats = w.client.stats()["lambdas"]
        budget, need = stats["memory_budget"], stats["per_lambda"][name]["memory_estimate_mb"]
        room = budget["limit_mb"] - budget["reserve_mb"] - budget["used_mb"]
        if room < need:
            return
        w.deploy_source(f"filler{i}", HOLDING.format(mb=max(1, int(room - need / 2) - 4)))
        w.client.run(f"filler{i}")
    raise AssertionError(f"the budget never filled: {budget}, a sandbox of {name} needs {need} MiB")


def test_under_a_full_budget_a_busy_lambda_queues_for_its_sandbox_instead_of_evicting(make_worker):
    """A request that finds its lambda's sandbox busy, when a new one would not fit without
    evicting another lambda's, waits for that sandbox (queued_instead) and evicts nothing;
    the worker serves on afterwards."""
    # A first sandbox's estimate a filler's size (not 32 MiB, which a filler's cold start
    # would evict to make room for, leaving the room it was to fill).
    w = make_worker(instances={"memory_budget_mb": BUDGET_MB, "max_per_lambda": 4, "sandbox_estimate_mb": 4})
    names = [f"holder{i}" for i in range(12)]
    for name in names:
        w.deploy_source(name, HOLDING.format(mb=12))
    w.deploy_source("slow", SLOW)
    for name in names:  # fill the budget with idle sandboxes of other lambdas
        assert w.client.run(name) == 12
    assert w.client.run("slow") == "done"  # its one sandbox, made by evicting if need be
    fill_until_a_sandbox_of(w, "slow")
    before = w.client.stats()["lambdas"]["memory_budget"]
    # Eight at once: several wait for the one sandbox together (rooms they give back must
    # not pass between them for ever, a livelock an earlier version had).
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda _: w.client.run("slow"), range(8))) == ["done"] * 8
    after = w.client.stats()["lambdas"]["memory_budget"]
    assert after["queued_instead"] > before["queued_instead"], after
    assert after["evictions"] == before["evictions"], (before, after)
    assert oom_kills(w) == 0
    assert w.client.run("holder0") == 12


WRITER = """
def f(event):
    with open(event["path"], "wb") as out:
        for _ in range(event["mb"]):
            out.write(b"x" * (1 << 20))
    return event["mb"]
"""


def test_page_cache_a_sandbox_leaves_is_not_counted_against_the_budget(make_worker, tmp_path):
    """Files written through a volume stay charged to the budget's cgroup as page cache,
    which the kernel drops at the limit: the budget counts what cannot be dropped, so cold
    starts after a big write still fit without evicting anything."""
    volume = tmp_path / "rw"
    volume.mkdir()
    if subprocess.run(["stat", "-f", "-c", "%T", str(volume)], capture_output=True, text=True).stdout.strip() == "tmpfs":
        pytest.skip("the volume is on tmpfs: what is written there is memory, not page cache")
    os.chown(volume, 65534, 65534)
    volumes = [{"host": str(volume), "path": "/data", "writable": True}]
    w = make_worker(instances={"memory_budget_mb": BUDGET_MB}, sandbox={"volumes": volumes})
    w.deploy_source("writer", WRITER)
    assert w.client.run("writer", {"path": "/data/big", "mb": 120}) == 120
    names = [f"holder{i}" for i in range(5)]
    for name in names:
        w.deploy_source(name, HOLDING.format(mb=12))
        assert w.client.run(name) == 12
    budget = w.client.stats()["lambdas"]["memory_budget"]
    assert budget["evictions"] == 0 and budget["waits"] == 0, budget
    assert budget["charged_mb"] >= budget["used_mb"], budget
    assert oom_kills(w) == 0


def test_without_a_budget_nothing_is_limited_or_reported(make_worker):
    w = make_worker()
    w.deploy_source("noop", "def f(event):\n    return 1\n")
    assert w.client.run("noop") == 1
    assert w.client.stats()["lambdas"]["memory_budget"] is None
