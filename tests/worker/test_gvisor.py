"""The gvisor back-end (crates/sandbox/src/gvisor): each lambda's sandboxes in a gVisor
sandbox of its own (a pod) on the systrap platform, which needs no hardware virtualization
and so runs on this machine. The same lambdas and contract as every back-end, and what only
a second kernel gives: the handler sees gVisor's kernel, not the host's."""

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import sprout
from conftest import EXAMPLES, ROOT, SPROUT, offline, targz

RUNSC = Path("/var/lib/sprout/gvisor") / (ROOT / "crates/sandbox/src/gvisor/runsc.version").read_text().strip() / "runsc"


@pytest.fixture
def gvisor(make_worker):
    w = make_worker(sandbox={"backend": "gvisor", "start_timeout_ms": 60000}, gvisor={"pod_idle_ms": 500},
                    limits={"timeout_ms": 3000, "memory_mb": 64})
    for example in ("echo", "hello", "fail"):
        w.client.deploy(str(EXAMPLES / example))
    return w


def test_runs_function_and_wsgi_lambdas(gvisor):
    assert gvisor.client.stats()["backend"] == "gvisor"
    assert gvisor.client.run("echo", {"x": [1, 2]}) == {"x": [1, 2]}
    assert gvisor.client.request("GET", "hello", "/ada").body == b"<h1>Hello, ada!</h1>\n"
    second = gvisor.client.request("POST", "echo", "", b"2")
    assert second.headers["x-sprout-start"] == "warm" and second.json() == 2


def test_the_handler_sees_gvisors_kernel(gvisor):
    gvisor.deploy_source("kernel", (
        "import os, platform\n"
        "def f(e):\n"
        "    return {'release': platform.release(), 'version': open('/proc/version').read(),\n"
        "            'uid': os.getuid(), 'ppid': os.getppid()}\n"))
    seen = gvisor.client.run("kernel")
    assert "gvisor" in seen["release"] and "gvisor" in seen["version"].lower(), seen
    assert seen["uid"] == 65534


def test_reports_handler_errors_timeouts_and_memory(gvisor):
    with pytest.raises(sprout.SproutError) as err:
        gvisor.client.run("fail")
    assert err.value.code == "handler_exception" and "RuntimeError" in err.value.traceback
    gvisor.deploy_source("badimport", "import nothing_here\ndef f(e):\n    return e\n")
    with pytest.raises(sprout.SproutError) as err:
        gvisor.client.run("badimport")
    assert err.value.code == "load_error"
    gvisor.deploy_test_lambda("sleepy")
    with pytest.raises(sprout.SproutError) as err:
        gvisor.client.run("sleepy", {"seconds": 30})
    assert err.value.code == "timeout"
    gvisor.deploy_test_lambda("hog")
    with pytest.raises(sprout.SproutError) as err:
        gvisor.client.run("hog", {"mb": 512})
    assert err.value.code == "out_of_memory"
    assert gvisor.client.run("echo", "alive") == "alive"


def test_a_crash_is_a_crash_and_the_pod_serves_on(gvisor):
    gvisor.deploy_source("crasher", "import os\ndef f(e):\n    print('going down', flush=True)\n    os._exit(3)\n")
    with pytest.raises(sprout.SproutError) as err:
        gvisor.client.run("crasher")
    assert err.value.code == "sandbox_crashed"
    assert gvisor.client.run("echo", "still here") == "still here"


def test_a_lambda_with_packages(make_worker, wheel_dir):
    w = make_worker(**offline(wheel_dir, sandbox={"backend": "gvisor", "start_timeout_ms": 60000}))
    w.client.upload("pkg", targz({"f.py": "import alpha, beta\ndef f(e):\n    return [alpha.NAME, beta.NAME, hasattr(beta, 'VERSION2')]\n",
                                  "requirements.txt": "alpha==1.0\nbeta==2.0\n"}))
    assert w.client.run("pkg") == ["alpha", "beta", True]


def test_one_pod_per_lambda_its_sandboxes_forked_inside_and_gone_with_the_last(gvisor):
    """Concurrent calls make several sandboxes of one lambda in one gVisor sandbox; a second
    lambda gets a pod of its own; a pod whose last sandbox is gone stops after its idle time
    (scale to zero)."""
    gvisor.deploy_test_lambda("sleepy")
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda _: gvisor.client.request("POST", "sleepy", "", b'{"seconds": 0.5}'), range(4)))
    assert [r.status for r in replies] == [200] * 4
    assert sum(r.headers["x-sprout-start"] == "cold" for r in replies) >= 2
    assert gvisor.client.run("echo", 1) == 1
    assert len(pods(gvisor)) == 2, pods(gvisor)
    gvisor.client.delete("sleepy")
    deadline = time.time() + 10
    while len(pods(gvisor)) != 1 and time.time() < deadline:
        time.sleep(0.1)
    assert len(pods(gvisor)) == 1, pods(gvisor)
    assert gvisor.client.run("echo", 2) == 2


def test_a_handlers_output_is_its_requests(gvisor):
    gvisor.deploy_source("talker", "import sys\ndef f(e):\n    print('out', e)\n    print('err', e, file=sys.stderr)\n    return e\n")
    reply = gvisor.client.request("POST", "talker", "", b"7")
    request_id = reply.headers["x-sprout-request-id"]
    lines = [entry["message"] for entry in gvisor.client.request_logs(request_id) if entry["type"] in ("out", "err")]
    assert lines == ["out 7", "err 7"], lines


def pods(worker, status="running"):
    """The worker's gVisor sandboxes that runsc knows, running (containers created ahead for
    pods to be restored into are "created")."""
    state = worker.dir / "run" / "runsc-state"
    out = subprocess.run([str(RUNSC), "--root", str(state), "list", "-format", "json"], capture_output=True, text=True)
    return [c["id"] for c in json.loads(out.stdout or "[]") or [] if c["status"] == status]


def test_nothing_is_left_after_a_kill_9(gvisor):
    """A worker killed with its pods up (one restored from a template) and a container created
    ahead: `sprout worker cleanup` leaves no gVisor process, no cgroup (runsc's, in every v1
    hierarchy, included), no mount and no network; the worker starts again."""
    assert gvisor.client.run("echo", 1) == 1
    assert gvisor_processes(gvisor), "a pod should be running"
    gvisor.deploy_source("next", "def f(e):\n    return e\n")
    assert wait_for(lambda: "gVisor template made" in gvisor.log()), gvisor.log()[-2000:]
    assert gvisor.client.run("next", 3) == 3  # restored, with the lambda's link lent to it
    assert wait_for(lambda: pods(gvisor, "created")), "a container should be created ahead"
    gvisor.process.kill()
    gvisor.process.wait()
    gvisor.process = None
    report = json.loads(subprocess.run([str(SPROUT), "worker", "cleanup", str(gvisor.dir)], capture_output=True,
                                       text=True, check=True).stdout)
    assert report["cgroups_removed"], report
    deadline = time.time() + 5
    while gvisor_processes(gvisor) and time.time() < deadline:
        time.sleep(0.1)
    assert gvisor_processes(gvisor) == []
    assert gvisor.leftovers() == []
    gvisor.start()
    assert gvisor.client.run("echo", 2) == 2


def gvisor_processes(worker):
    """Host processes of this worker's pods (runsc names them by its state directory)."""
    out = subprocess.run(["pgrep", "-f", f"runsc-.*{worker.dir}/run/runsc-state"], capture_output=True, text=True)
    return out.stdout.split()


def test_a_lambdas_next_pod_has_its_network_again(make_worker):
    """runsc takes the address of the lambda's namespace away from the host's kernel while a
    pod runs and does not give it back; the worker restores it before the lambda's next pod
    starts (no sandbox kept here, so each pod idles out), which then has its link and routes.
    The first pod is started afresh; the next ones are restored from the template it had made,
    into containers created ahead, the lambda's link lent to each and taken back after."""
    w = make_worker(sandbox={"backend": "gvisor"}, gvisor={"pod_idle_ms": 200}, instances={"keep_warm": False})
    w.deploy_source("routes", "def f(e):\n    return open('/proc/net/route').read()\n")
    for _ in range(3):
        assert "eth0" in w.client.run("routes")
        deadline = time.time() + 60  # (the first pod's template is made meanwhile: slow on a busy host)
        while pods(w) and time.time() < deadline:
            time.sleep(0.1)
        assert pods(w) == []


WHO = ("import os, socket\n"
       "def f(e):\n"
       "    return {'code': sorted(n for n in os.listdir('/handler') if n != '__pycache__'), 'mark': open('/handler/mark.txt').read(),\n"
       "            'pid': os.getpid(), 'ppid': os.getppid()}\n")


def wait_for(predicate, seconds=30):
    deadline = time.time() + seconds
    while not predicate() and time.time() < deadline:
        time.sleep(0.1)
    return predicate()


@pytest.mark.parametrize("network", ["sandbox", "host"])
def test_first_pods_come_from_a_template_and_stay_apart(make_worker, network):
    """The first lambda of a package set starts its pod afresh and has the set's template
    made (a checkpoint of a pod whose Zygote imported the packages, its spares forked); the
    next lambdas' first pods are restored from it: each with its own code at /handler, its
    spares ready at once, in a gVisor sandbox and a network namespace of its own (with either
    network stack: gVisor's, or the host's inside the lambda's namespace)."""
    w = make_worker(sandbox={"backend": "gvisor", "start_timeout_ms": 60000}, gvisor={"network": network})
    w.deploy_source("first", WHO, **{"mark.txt": "first"})
    assert w.client.run("first")["mark"] == "first"
    assert wait_for(lambda: "gVisor template made" in w.log()), w.log()[-3000:]
    for name in ("left", "right"):
        w.deploy_source(name, WHO, **{"mark.txt": name})
    seen = {name: w.client.request("POST", name, "", b"{}") for name in ("left", "right")}
    assert w.log().count("restored from its package set's template") == 2, w.log()[-3000:]
    for name, reply in seen.items():
        assert reply.headers["x-sprout-start"] == "cold"
        body = reply.json()
        # Only its own code; bound from a spare the template forked (the Zygote is pid 1).
        assert body["code"] == ["f.py", "mark.txt"] and body["mark"] == name, body
        assert body["ppid"] == 1, body
    assert len(pods(w)) == 3, pods(w)
    netns = {os.readlink(f"/proc/{sandbox_pid(w, c)}/ns/net") for c in pods(w)}
    assert len(netns) == 3, netns
    assert w.client.run("left")["mark"] == "left"
    # The next lambda's container is created ahead, in a namespace of its own.
    assert wait_for(lambda: len(pods(w, "created")) == 1), pods(w, "created")


def sandbox_pid(worker, container):
    state = worker.dir / "run" / "runsc-state"
    out = subprocess.run([str(RUNSC), "--root", str(state), "state", container], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["pid"]


def test_new_code_gets_the_lambdas_link_from_its_idle_pod(make_worker):
    """A pod restored into a container created ahead holds its lambda's link lent; the
    lambda's new code gets a pod of its own while the old one idles, and the link with it."""
    w = make_worker(sandbox={"backend": "gvisor"}, instances={"keep_warm": False})
    w.deploy_source("maker", "def f(e):\n    return e\n")
    assert w.client.run("maker", 1) == 1
    assert wait_for(lambda: "gVisor template made" in w.log() and pods(w, "created")), w.log()[-2000:]
    source = "def f(e):\n    return ['{v}', open('/proc/net/route').read()]\n"
    w.deploy_source("net", source.format(v="v1"))
    version, routes = w.client.run("net")
    assert version == "v1" and "eth0" in routes
    assert "lambda=net" in w.log() and "restored from" in w.log()
    w.deploy_source("net", source.format(v="v2"))
    version, routes = w.client.run("net")
    assert version == "v2" and "eth0" in routes, routes


def test_a_quiet_pod_lets_its_spares_go_and_forks_one_for_the_next_cold_start(make_worker):
    """Spares are for bursts of cold starts: inside gVisor each holds a handler's pages
    (several MiB), so a pod with no cold start for `spares_idle_ms` lets them go, and the
    next cold start forks one on its own path; then a burst finds spares again."""
    w = make_worker(sandbox={"backend": "gvisor", "start_timeout_ms": 60000},
                    gvisor={"spares_idle_ms": 300}, instances={"keep_warm": False})
    w.deploy_source("quiet", WHO, **{"mark.txt": "quiet"})

    def let_go():
        return w.client.stats()["backends"]["gvisor"]["counters"]["spares_let_go"]

    assert w.client.run("quiet")["mark"] == "quiet"  # the pod starts with its spares
    assert wait_for(lambda: let_go() >= 2, 10), w.client.stats()["backends"]
    gone = let_go()
    # With none left, cold starts still bind, one after another and several at once.
    assert w.client.run("quiet")["mark"] == "quiet"
    with ThreadPoolExecutor(4) as pool:
        assert [r["mark"] for r in pool.map(lambda _: w.client.run("quiet"), range(4))] == ["quiet"] * 4
    assert wait_for(lambda: let_go() > gone, 10), "the burst's spares went too"
    assert 'sprout_spares_let_go_total{backend="gvisor"}' in w.client.metrics()
