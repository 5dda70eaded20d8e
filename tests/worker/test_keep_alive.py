"""Keep-alive windows on a real worker: with `keep_alive = "histogram"` each lambda's window
comes from its idle times (until it has ten, `idle_timeout_s`), `/stats` shows it, and an
idle sandbox goes when its window ends. The policy itself is unit-tested on synthetic
histories (crates/worker/src/keepalive.rs)."""

import time

from conftest import EXAMPLES


def test_a_young_lambda_keeps_the_fixed_window_and_its_sandbox_goes_when_it_ends(make_worker):
    w = make_worker(instances={"keep_alive": "histogram", "idle_timeout_s": 2})
    w.client.deploy(str(EXAMPLES / "echo"))
    for i in range(3):
        assert w.client.run("echo", i) == i
    window = w.client.stats()["lambdas"]["per_lambda"]["echo"]["keep_alive"]
    assert window == {"policy": "histogram", "basis": "young", "prewarm_s": 0.0, "keep_alive_s": 2.0, "idle_times": 2}
    deadline = time.monotonic() + 10
    while "echo" in w.client.stats()["lambdas"]["per_lambda"]:
        assert time.monotonic() < deadline, "the idle sandbox outlived its window"
        time.sleep(0.2)


def test_the_histogram_policy_is_the_default_and_fixed_can_be_chosen(worker, make_worker):
    worker.client.run("echo", 1)
    window = worker.client.stats()["lambdas"]["per_lambda"]["echo"]["keep_alive"]
    assert (window["policy"], window["basis"], window["keep_alive_s"]) == ("histogram", "young", 300.0)
    fixed = make_worker(instances={"keep_alive": "fixed"})
    fixed.client.deploy(str(EXAMPLES / "echo"))
    fixed.client.run("echo", 1)
    window = fixed.client.stats()["lambdas"]["per_lambda"]["echo"]["keep_alive"]
    assert window == {"policy": "fixed", "keep_alive_s": 300.0}


def test_metrics_show_each_lambdas_sandboxes_and_windows(make_worker):
    w = make_worker(instances={"idle_timeout_s": 120})
    w.client.deploy(str(EXAMPLES / "echo"))
    w.client.run("echo", 1)
    metrics = w.client.metrics()
    assert 'sprout_lambda_sandboxes{lambda="echo",state="idle"} 1' in metrics
    assert 'sprout_lambda_sandboxes{lambda="echo",state="busy"} 0' in metrics
    assert 'sprout_lambda_keep_alive_seconds{lambda="echo"} 120.0' in metrics
    assert 'sprout_lambda_prewarm_seconds{lambda="echo"} 0.0' in metrics
    assert "sprout_lambda_memory_estimate_bytes" not in metrics  # only under a memory budget
