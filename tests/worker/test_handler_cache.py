"""The handler cache: an idle sandbox is paused with the cgroup freezer, resumed for its
lambda's next request, and evicted least recently used first when paused sandboxes pass
their memory (PSS) limit."""

import time
from pathlib import Path

from conftest import EXAMPLES


def sandbox_freezer_states(worker):
    """{group: freezer state} of this worker's sandbox cgroups that hold processes."""
    root = Path("/sys/fs/cgroup/freezer") / worker.cgroup_names[0]
    states = {}
    for group in root.glob("sb-*"):
        if (group / "cgroup.procs").read_text().split():
            states[group.name] = (group / "freezer.state").read_text().strip()
    return states


def run(worker, name, event=1):
    response = worker.client.request("POST", name, "/", str(event).encode(), {"Content-Type": "application/json"})
    assert response.status == 200, response.body
    return response.headers["X-Sprout-Start"], int(response.headers["X-Sprout-Sandbox"])


def wait_for(predicate, seconds=10):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_idle_sandboxes_are_paused_and_resumed(make_worker):
    w = make_worker()
    w.client.deploy(str(EXAMPLES / "echo"))
    start, sandbox = run(w, "echo")
    assert start == "cold"
    assert wait_for(lambda: list(sandbox_freezer_states(w).values()) == ["FROZEN"]), sandbox_freezer_states(w)
    for i in range(3):
        assert run(w, "echo", i) == ("warm", sandbox)
        # Paused again once idle for handler_cache.pause_after_ms (100 ms by default).
        assert wait_for(lambda: list(sandbox_freezer_states(w).values()) == ["FROZEN"])
    cache = w.client.stats()["handler_cache"]
    assert cache["paused"] == 1 and cache["pauses"] == 4 and cache["resumes"] == 3
    assert wait_for(lambda: w.client.stats()["handler_cache"]["paused_pss_mb"] > 0)
    metrics = w.client.metrics()
    assert "sprout_handler_cache_paused 1" in metrics and 'sprout_handler_cache_evictions_total{reason="memory"} 0' in metrics


def test_a_sandbox_reused_at_once_is_never_paused(make_worker):
    w = make_worker(handler_cache={"pause_after_ms": 2000})
    w.client.deploy(str(EXAMPLES / "echo"))
    _, sandbox = run(w, "echo")
    for i in range(5):
        assert run(w, "echo", i) == ("warm", sandbox)
    assert w.client.stats()["handler_cache"]["pauses"] == 0
    assert wait_for(lambda: list(sandbox_freezer_states(w).values()) == ["FROZEN"], seconds=5)


def test_pausing_can_be_turned_off(make_worker):
    w = make_worker(handler_cache={"pause": False})
    w.client.deploy(str(EXAMPLES / "echo"))
    _, sandbox = run(w, "echo")
    time.sleep(0.3)
    assert list(sandbox_freezer_states(w).values()) == ["THAWED"]
    assert run(w, "echo") == ("warm", sandbox)
    assert w.client.stats()["handler_cache"]["pauses"] == 0


def test_paused_sandboxes_past_the_memory_limit_go_least_recently_used(make_worker):
    # Measure what three paused echo sandboxes hold (PSS: they share the Zygote's pages, so
    # three cost far less than three times one), and allow a little less than that.
    probe = make_worker()
    for n in range(3):
        probe.client.upload(f"echo{n}", open_targz(EXAMPLES / "echo"))
        run(probe, f"echo{n}")
    time.sleep(1.5)
    three = probe.client.stats()["handler_cache"]["paused_pss_mb"]
    limit = int(three)

    w = make_worker(handler_cache={"memory_mb": limit})
    for n in range(5):
        w.client.upload(f"echo{n}", open_targz(EXAMPLES / "echo"))
    for n in range(5):
        assert run(w, f"echo{n}")[0] == "cold"
        time.sleep(0.3)  # let each pause be measured, so the order of use is the order here
    assert wait_for(lambda: w.client.stats()["handler_cache"]["evictions"]["memory"] >= 2), w.client.stats()["handler_cache"]
    cache = w.client.stats()["handler_cache"]
    assert cache["paused_pss_mb"] <= limit, cache
    # The most recently used is still there; the least recently used was evicted.
    assert run(w, "echo4")[0] == "warm"
    assert run(w, "echo0")[0] == "cold"


def open_targz(directory):
    import io
    import tarfile
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(str(directory / "f.py"), arcname="f.py")
    return buffer.getvalue()
