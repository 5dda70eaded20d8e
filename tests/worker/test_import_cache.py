"""The import cache: a tree of Zygotes with packages imported ahead. Selection never hands a
lambda a Zygote holding packages it did not ask for; partial matches grow child Zygotes;
Zygotes learn what lambdas import; dead Zygotes are replaced; a static tree is made at start;
eviction spares Zygotes with live children."""

import json
import os
import signal
import threading
import time

import pytest

from conftest import deploy_with, offline, probe, zygote_nodes


def node_with(stats, *keys):
    """The live tree node holding exactly the packages `keys` adds up to, or None."""
    for node in zygote_nodes(stats):
        if node["id"] != 0 and sorted(keys) == sorted(all_packages(stats, node)) and not node["retired"]:
            return node
    return None


def all_packages(stats, target):
    """Packages of `target`, its ancestors' included."""
    def walk(node, held):
        held = held + node["adds"]
        if node["id"] == target["id"]:
            return held
        for child in node["children"]:
            found = walk(child, held)
            if found is not None:
                return found
        return None
    return walk(stats["import_cache"]["tree"], [])


def parent_of(stats, target):
    for node in zygote_nodes(stats):
        if any(c["id"] == target["id"] for c in node["children"]):
            return node
    return None


def zygote_pid(worker, node_id):
    path = f"/sys/fs/cgroup/pids/{worker.cgroup_names[0]}/zygote-{node_id}/cgroup.procs"
    return int(open(path).read().split()[0])


AB = "alpha==1.0\nbeta==1.0\n"
B = "beta==1.0\n"


def test_a_lambda_is_never_forked_from_a_zygote_holding_packages_it_did_not_ask_for(make_worker, wheel_dir):
    w = make_worker(**offline(wheel_dir, instances={"keep_warm": False}))
    deploy_with(w, "ab", probe(["alpha"]), AB)
    deploy_with(w, "b", probe(["beta"]), B)
    assert w.client.run("ab")["preloaded"] == ["alpha", "beta"]
    # A Zygote holding alpha and beta exists, but "b" asked only for beta.
    out = w.client.run("b", {"try": ["alpha"]})
    assert out["preloaded"] == ["beta"] and out["alpha"] is False
    stats = w.client.stats()
    assert node_with(stats, "alpha==1.0", "beta==1.0") and node_with(stats, "beta==1.0")
    assert stats["import_cache"]["zygotes_created"] == 2


def test_a_partial_match_grows_a_child_zygote_and_an_exact_one_is_a_hit(make_worker, wheel_dir):
    w = make_worker(**offline(wheel_dir, instances={"keep_warm": False}))
    deploy_with(w, "b", probe(["beta"]), B)
    deploy_with(w, "ab", probe(["alpha"]), AB)
    assert w.client.run("b")["preloaded"] == ["beta"]
    assert w.client.run("ab")["preloaded"] == ["alpha", "beta"]
    stats = w.client.stats()
    zb, zab = node_with(stats, "beta==1.0"), node_with(stats, "alpha==1.0", "beta==1.0")
    assert zab["adds"] == ["alpha==1.0"] and parent_of(stats, zab)["id"] == zb["id"]
    assert parent_of(stats, zb)["id"] == 0
    for _ in range(3):
        assert w.client.run("ab")["preloaded"] == ["alpha", "beta"]
    cache = w.client.stats()["import_cache"]
    assert cache["import_cache_misses"] == 2 and cache["import_cache_hits"] == 3 and cache["zygotes_created"] == 2


def test_a_zygote_imports_ahead_the_package_modules_its_lambdas_code_imports(make_worker, wheel_dir):
    # f.py imports alpha.sub: found at upload, so the first Zygote imports it, and no fuller
    # one has to replace it after the first handlers imported it themselves.
    w = make_worker(**offline(wheel_dir, instances={"keep_warm": False}))
    deploy_with(w, "sub", probe(["alpha.sub"]), AB)
    assert "alpha.sub" in w.client.run("sub")["preloaded"]
    assert "alpha.sub" in w.client.run("sub")["preloaded"]
    cache = w.client.stats()["import_cache"]
    assert cache["zygotes_created"] == 1 and cache["zygote_refreshes"] == 0


GC_PROBE = """import gc
import alpha


def f(event):
    before = gc.get_stats()[0]["collections"]
    for _ in range(5000):
        cycle = []
        cycle.append(cycle)
    return {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count(),
            "collections": gc.get_stats()[0]["collections"] - before}
"""


def test_a_handler_from_a_package_zygote_has_the_collector_on_and_the_imports_frozen(make_worker, wheel_dir):
    # The Zygote imports with the collector off: its handlers must get it back, running on
    # their own garbage (5,000 cycles start collections by themselves) and not on the imports.
    w = make_worker(**offline(wheel_dir, instances={"keep_warm": False}))
    deploy_with(w, "gc", GC_PROBE, AB)
    out = w.client.run("gc")
    assert out["enabled"] is True and out["collections"] >= 1, out
    assert out["frozen"] > 1000, out
    assert w.client.stats()["import_cache"]["zygotes_created"] == 1


def test_zygotes_learn_what_handlers_import_at_run_time(make_worker, wheel_dir):
    # alpha.sub is imported by name while serving, where reading the code cannot see it.
    w = make_worker(**offline(wheel_dir, instances={"keep_warm": False}))
    deploy_with(w, "lazy", probe(["alpha"]), AB)
    first = w.client.run("lazy", {"try": ["alpha.sub"]})
    assert first["alpha.sub"] is True and "alpha.sub" not in first["preloaded"]
    deadline = time.time() + 20
    while "alpha.sub" not in w.client.run("lazy")["preloaded"]:
        assert time.time() < deadline, "the Zygote never learned alpha.sub"
        time.sleep(0.2)
    assert w.client.stats()["import_cache"]["zygote_refreshes"] >= 1


def test_a_request_during_a_zygotes_replacement_is_served_by_the_old_one(make_worker, wheel_dir):
    # "slow" needs alpha.slow (2 s to import): the exact Zygote lacks it, so a fuller one is
    # built in the background; "plain" keeps being forked from the old one meanwhile.
    w = make_worker(**offline(wheel_dir, instances={"keep_warm": False}))
    deploy_with(w, "plain", probe(["alpha"]), AB)
    deploy_with(w, "slow", probe(["alpha.slow"]), AB)
    assert "alpha.slow" not in w.client.run("plain")["preloaded"]
    old = node_with(w.client.stats(), "alpha==1.0", "beta==1.0")
    slow = threading.Thread(target=w.client.run, args=("slow",))
    slow.start()
    try:
        deadline = time.time() + 10
        while not node_with(w.client.stats(), "alpha==1.0", "beta==1.0")["replacing"]:
            assert time.time() < deadline, "no replacement was started"
            time.sleep(0.05)
        out = w.client.run("plain")
        during = w.client.stats()
        assert "alpha.slow" not in out["preloaded"]  # forked from the old Zygote...
        current = node_with(during, "alpha==1.0", "beta==1.0")
        assert current["id"] == old["id"] and current["replacing"]  # ...without waiting for the new
    finally:
        slow.join()
    deadline = time.time() + 20
    while "alpha.slow" not in w.client.run("plain")["preloaded"]:
        assert time.time() < deadline, "the replacement never took over"
        time.sleep(0.2)
    assert w.client.stats()["import_cache"]["zygote_refreshes"] == 1


def test_a_zygote_that_fails_to_build_leaves_its_request_served_without_it(make_worker, wheel_dir):
    # The Zygote for "slow" cannot import alpha.slow within the import timeout: the request is
    # served by a handler forked from the root, which imports the packages itself.
    w = make_worker(**offline(wheel_dir, instances={"keep_warm": False}, import_cache={"import_timeout_ms": 500}))
    deploy_with(w, "slow", probe(["alpha.slow"]), AB)
    out = w.client.run("slow", {"try": ["alpha.slow"]})
    assert out["preloaded"] == [] and out["alpha.slow"] is True
    cache = w.client.stats()["import_cache"]
    assert cache["zygote_creation_failures"] == 1 and cache["import_cache_fallbacks"] == 1
    # Within the back-off the next cold start does not wait for another attempt.
    assert w.client.run("slow")["preloaded"] == []
    cache = w.client.stats()["import_cache"]
    assert cache["zygote_creation_failures"] == 1 and cache["import_cache_fallbacks"] == 2


def test_a_dead_zygote_is_replaced_and_its_lambdas_served_meanwhile(make_worker, wheel_dir):
    w = make_worker(**offline(wheel_dir, instances={"keep_warm": False}))
    deploy_with(w, "ab", probe(["alpha"]), AB)
    w.client.run("ab")
    old = node_with(w.client.stats(), "alpha==1.0", "beta==1.0")
    os.kill(zygote_pid(w, old["id"]), signal.SIGKILL)
    # Until the worker has seen the death, a cold start may still take one of the Zygote's
    # spares as the kernel kills them with it (its PID namespace's init), and a crash in the
    # middle of f(event) is never run again: wait for the worker to know.
    deadline = time.time() + 10
    while w.client.stats()["import_cache"]["zygote_deaths"] < 1:
        assert time.time() < deadline, "the worker did not notice its Zygote's death"
        time.sleep(0.02)
    # Served right away: by a new Zygote, or by the root while there is none.
    assert sorted(w.client.run("ab", {"try": ["alpha"]})["paths"]) == ["/packages/alpha==1.0", "/packages/beta==1.0"]
    deadline = time.time() + 10
    while time.time() < deadline:
        stats = w.client.stats()
        new = node_with(stats, "alpha==1.0", "beta==1.0")
        if new and new["id"] != old["id"] and stats["import_cache"]["zygote_deaths"] >= 1:
            break
        w.client.run("ab")
        time.sleep(0.1)
    else:
        pytest.fail(f"the dead Zygote was not replaced: {json.dumps(stats['import_cache'])}")
    assert w.client.run("ab")["preloaded"] == ["alpha", "beta"]


def test_a_handler_killed_with_its_zygote_while_loading_is_started_again(make_worker, wheel_dir):
    # A Zygote is PID 1 of the namespace its handlers live in: they die with it.
    w = make_worker(**offline(wheel_dir, instances={"keep_warm": False}))
    deploy_with(w, "ab", probe(["alpha"]) + "\nimport time\ntime.sleep(1)\n", AB)
    w.client.run("ab")
    old = node_with(w.client.stats(), "alpha==1.0", "beta==1.0")
    outcome = {}

    def run():
        try:
            outcome["out"] = w.client.run("ab", {"try": ["alpha"]})
        except Exception as e:  # noqa: BLE001 - reported below
            outcome["error"] = e

    caller = threading.Thread(target=run)
    caller.start()
    time.sleep(0.4)  # its handler is loading, forked from the Zygote
    os.kill(zygote_pid(w, old["id"]), signal.SIGKILL)
    caller.join(30)
    assert "error" not in outcome, outcome.get("error")
    assert sorted(outcome["out"]["paths"]) == ["/packages/alpha==1.0", "/packages/beta==1.0"]
    assert w.client.stats()["import_cache"]["zygote_deaths"] == 1


def test_a_static_tree_is_made_at_start_and_used(tmp_path, make_worker, wheel_dir):
    tree = tmp_path / "tree.json"
    tree.write_text(json.dumps({"packages": [], "children": [
        {"packages": ["beta==1.0"], "children": [{"packages": ["alpha==1.0"], "children": []}]},
    ]}))
    w = make_worker(**offline(wheel_dir, import_cache={"tree": str(tree)}, instances={"keep_warm": False}))
    deadline = time.time() + 30
    while not node_with(w.client.stats(), "alpha==1.0", "beta==1.0") and time.time() < deadline:
        time.sleep(0.1)
    stats = w.client.stats()
    zb, zab = node_with(stats, "beta==1.0"), node_with(stats, "alpha==1.0", "beta==1.0")
    assert zb and zab and zb["pinned"] and zab["pinned"] and parent_of(stats, zab)["id"] == zb["id"]
    deploy_with(w, "ab", probe(["alpha"]), AB)
    assert w.client.run("ab")["preloaded"] == ["alpha", "beta"]
    cache = w.client.stats()["import_cache"]
    assert cache["import_cache_hits"] == 1 and cache["zygotes_created"] == 2


def test_a_malformed_static_tree_stops_the_start(tmp_path, wheel_dir):
    from conftest import Worker
    tree = tmp_path / "tree.json"
    tree.write_text('{"packages": [], "kids": []}')
    w = Worker(tmp_path / "w", offline(wheel_dir, import_cache={"tree": str(tree)}))
    with pytest.raises(RuntimeError) as err:
        w.start()
    assert "kids" in str(err.value) and "tree" in str(err.value)
    assert w.leftovers() == []


def test_eviction_spares_zygotes_with_live_children(make_worker, wheel_dir):
    # A 1 MiB budget: every package Zygote is over it, so only live children protect them.
    w = make_worker(**offline(wheel_dir, import_cache={"memory_mb": 1}))
    deploy_with(w, "b", probe(["beta"]), B)
    deploy_with(w, "ab", probe(["alpha"]), AB)
    w.client.run("b")   # Zygote {beta}, with a paused handler of "b"
    w.client.run("ab")  # its child {alpha, beta}, with a paused handler of "ab"
    time.sleep(2.5)
    stats = w.client.stats()
    zb, zab = node_with(stats, "beta==1.0"), node_with(stats, "alpha==1.0", "beta==1.0")
    assert zb and zab and stats["import_cache"]["zygote_evictions"] == 0
    w.client.delete("b")  # its handler goes; {beta} still has a live child Zygote
    time.sleep(2.5)
    stats = w.client.stats()
    assert node_with(stats, "beta==1.0") and stats["import_cache"]["zygote_evictions"] == 0
    w.client.delete("ab")  # now nothing holds them: the child goes first, then its parent
    deadline = time.time() + 10
    while w.client.stats()["import_cache"]["zygotes"] > 1 and time.time() < deadline:
        time.sleep(0.2)
    assert w.client.stats()["import_cache"]["zygotes"] == 1
    order = [line for line in w.log().splitlines() if "evicting a Zygote" in line]
    assert len(order) == 2 and f"zygote={zab['id']}" in order[0] and f"zygote={zb['id']}" in order[1], order


def test_without_the_import_cache_handlers_import_for_themselves(make_worker, wheel_dir):
    w = make_worker(**offline(wheel_dir, import_cache={"enabled": False}))
    deploy_with(w, "ab", probe(["alpha"]), AB)
    out = w.client.run("ab")
    assert out["preloaded"] == [] and out["paths"] == ["/packages/beta==1.0", "/packages/alpha==1.0"]
    cache = w.client.stats()["import_cache"]
    assert cache["zygotes"] == 1 and cache["import_cache_fallbacks"] == 1 and not cache["enabled"]


def test_sprout_zygotes_prints_the_tree(make_worker, wheel_dir):
    w = make_worker(**offline(wheel_dir))
    deploy_with(w, "ab", probe(["alpha"]), AB)
    w.client.run("ab")
    out = w.sprout("zygotes", w.dir).stdout
    assert "#0 root" in out and "alpha==1.0" in out and "beta==1.0" in out and "└─ #" in out
