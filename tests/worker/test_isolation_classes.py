"""Isolation classes (crates/worker/src/isolation.rs, backends.rs): one worker runs lean and
gVisor lambdas side by side. The operator chooses a lambda's class (the configuration's
`[isolation] lambdas`, or `?isolation=` at upload, which later uploads keep); a lambda's own
ol.yaml may raise its class, never lower it; both classes answer with the same API and
errors, and /stats and /metrics count sandboxes by back-end."""

import json
import re

import pytest

import sprout
from conftest import targz

KERNEL = "import platform\ndef f(e):\n    return platform.release()\n"
FAIL = "def f(e):\n    raise ValueError('no')\n"


@pytest.fixture
def mixed(make_worker):
    return make_worker(sandbox={"backend": "sock", "start_timeout_ms": 60000},
                       isolation={"classes": ["gvisor"], "lambdas": {"billing": "gvisor"}},
                       gvisor={"pod_idle_ms": 500}, limits={"timeout_ms": 3000})


def deploy(w, name, source, isolation=None, **files):
    return w.client.upload(name, targz({"f.py": source, **files}), isolation=isolation)


def in_gvisor(w, name):
    return "gvisor" in w.client.run(name)


def test_each_lambda_runs_in_the_class_the_operator_gave_it(mixed):
    assert deploy(mixed, "plain", KERNEL)["backend"] == "sock"
    assert deploy(mixed, "billing", KERNEL)["backend"] == "gvisor"  # the configuration's choice
    chosen = deploy(mixed, "chosen", KERNEL, isolation="gvisor")
    assert chosen["backend"] == "gvisor" and chosen["isolation"] == "gvisor"
    assert deploy(mixed, "lowered", KERNEL, isolation="sock")["backend"] == "sock"
    assert [in_gvisor(mixed, n) for n in ("plain", "billing", "chosen", "lowered")] == [False, True, True, False]
    # A later upload without a class keeps the operator's choice.
    assert deploy(mixed, "chosen", KERNEL + "# v2\n")["backend"] == "gvisor"
    assert in_gvisor(mixed, "chosen") and mixed.client.get("chosen")["backend"] == "gvisor"


def test_a_tenants_ol_yaml_raises_the_class_and_never_lowers_it(mixed):
    assert deploy(mixed, "asks-more", KERNEL, **{"ol.yaml": "isolation: gvisor\n"})["backend"] == "gvisor"
    assert deploy(mixed, "billing", KERNEL, **{"ol.yaml": "isolation: sock\n"})["backend"] == "gvisor"
    assert in_gvisor(mixed, "asks-more") and in_gvisor(mixed, "billing")
    with pytest.raises(sprout.SproutError) as err:  # stronger than sock, and not run here
        deploy(mixed, "asks-runc", KERNEL, **{"ol.yaml": "isolation: runc\n"})
    assert err.value.code == "invalid_lambda_config" and "not served by this worker" in str(err.value)
    with pytest.raises(sprout.SproutError) as err:
        deploy(mixed, "asks-nonsense", KERNEL, **{"ol.yaml": "isolation: firecracker\n"})
    assert err.value.code == "invalid_lambda_config" and "firecracker" in str(err.value)
    assert "asks-runc" not in mixed.client.list() and "asks-nonsense" not in mixed.client.list()


def test_an_upload_naming_a_class_the_worker_does_not_run_is_refused_and_loses_nothing(mixed):
    deploy(mixed, "kept", KERNEL, isolation="gvisor")
    for query in ("isolation=runc", "isolation=", "colour=blue"):
        with pytest.raises(sprout.SproutError) as err:
            mixed.client.upload(f"kept?{query}", targz({"f.py": KERNEL}))
        assert err.value.code == "invalid_request", query
    assert mixed.client.get("kept")["version"] and in_gvisor(mixed, "kept")


def test_both_classes_answer_with_the_same_errors(mixed):
    deploy(mixed, "fail-lean", FAIL)
    deploy(mixed, "fail-sealed", FAIL, isolation="gvisor")
    deploy(mixed, "slow-lean", "import time\ndef f(e):\n    time.sleep(30)\n")
    deploy(mixed, "slow-sealed", "import time\ndef f(e):\n    time.sleep(30)\n", isolation="gvisor")
    for lean, sealed in (("fail-lean", "fail-sealed"), ("slow-lean", "slow-sealed")):
        answers = []
        for name in (lean, sealed):
            with pytest.raises(sprout.SproutError) as err:
                mixed.client.run(name)
            answers.append((err.value.status, err.value.code))
        assert answers[0] == answers[1], answers
    assert answers[0][1] == "timeout"


def test_stats_and_metrics_count_sandboxes_by_back_end(mixed):
    deploy(mixed, "plain", KERNEL)
    deploy(mixed, "billing", "import platform\ndef f(e):\n    print('billed', flush=True)\n    return platform.release()\n")
    mixed.client.run("plain")
    mixed.client.run("billing")
    mixed.client.run("billing")
    stats = mixed.client.stats()
    assert stats["backend"] == "sock" and sorted(stats["backends"]) == ["gvisor", "sock"]
    assert stats["backends"]["sock"]["counters"]["created"] == 1
    assert stats["backends"]["gvisor"]["counters"]["created"] == 1
    assert stats["backends"]["gvisor"]["sandboxes"]["idle"] + stats["backends"]["gvisor"]["sandboxes"]["busy"] == 1
    assert stats["backend_counters"]["created"] == 2
    text = mixed.client.metrics()
    assert 'sprout_sandboxes_created_total{backend="gvisor"} 1' in text, text
    assert 'sprout_sandboxes_created_total{backend="sock"} 1' in text
    assert 'sprout_sandboxes{state="idle",backend="gvisor"}' in text
    printed = [e for e in mixed.client.logs("billing") if e["message"] == "billed"]
    assert len(printed) == 2 and {e["backend"] for e in printed} == {"gvisor"}, printed


def test_the_operators_choice_outlives_a_restart(mixed):
    deploy(mixed, "chosen", KERNEL, isolation="gvisor")
    mixed.stop()
    mixed.start()
    assert mixed.client.get("chosen")["backend"] == "gvisor" and in_gvisor(mixed, "chosen")


def test_a_configuration_naming_a_class_the_worker_does_not_run_is_refused(tmp_path, sprout_bin):
    from conftest import Worker

    w = Worker(tmp_path / "w", {"isolation": {"lambdas": {"billing": "gvisor"}}})
    refused = w.sprout("worker", "init", w.dir, check=False)
    assert refused.returncode != 0 and "add it to isolation.classes" in refused.stderr, refused.stderr


def test_the_command_line_deploys_into_a_class_and_shows_them(mixed):
    from conftest import EXAMPLES

    out = mixed.sprout("deploy", EXAMPLES / "echo", "--name", "sealed-echo", "--isolation", "gvisor", "--url", mixed.url)
    assert json.loads(out.stdout)["backend"] == "gvisor"
    assert mixed.client.run("sealed-echo", "hi") == "hi"
    shown = mixed.sprout("show", "sealed-echo", "--url", mixed.url).stdout
    assert re.search(r"backend\s+gvisor", shown), shown
    stats = mixed.sprout("stats", "--url", mixed.url).stdout
    assert re.search(r"gvisor: starting 0, busy 0, idle 1; 1 made", stats), stats
    refused = mixed.sprout("deploy", EXAMPLES / "echo", "--isolation", "vm", "--url", mixed.url, check=False)
    assert refused.returncode != 0 and "invalid_request" in refused.stderr + refused.stdout
