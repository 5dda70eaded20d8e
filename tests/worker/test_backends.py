"""The same lambdas and the same contract on every sandbox backend: the lean sandbox without
a Zygote, and the runc and Docker baselines the benchmarks compare SOCK with."""

import shutil
import subprocess
import time

import pytest

import sprout
from conftest import EXAMPLES

DOCKER_SOCKET = "/var/run/docker.sock"


def docker_answers():
    import socket

    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(DOCKER_SOCKET)
            s.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
            return b"OK" in s.recv(4096)
    except OSError:
        return False


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory):
    """Debian's Docker engine, started for the tests if it is not running (and stopped after)."""
    if docker_answers():
        yield
        return
    dockerd = shutil.which("dockerd")
    assert dockerd, "dockerd is missing: scripts/setup.sh installs docker.io"
    log = open(tmp_path_factory.mktemp("dockerd") / "dockerd.log", "wb")
    engine = subprocess.Popen([dockerd, "--iptables=false", "--bridge=none"], stdout=log, stderr=log)
    deadline = time.time() + 60
    while not docker_answers():
        assert engine.poll() is None and time.time() < deadline, "dockerd did not start"
        time.sleep(0.2)
    yield
    engine.terminate()
    engine.wait(timeout=60)


@pytest.fixture(params=["sock-nozygote", "runc", "docker"])
def baseline(request, make_worker):
    if request.param == "docker":
        request.getfixturevalue("docker_engine")
    w = make_worker(sandbox={"backend": request.param, "start_timeout_ms": 60000},
                    limits={"timeout_ms": 3000, "memory_mb": 64})
    w.client.deploy(str(EXAMPLES / "echo"))
    w.client.deploy(str(EXAMPLES / "hello"))
    w.client.deploy(str(EXAMPLES / "fail"))
    return w


def test_runs_function_and_wsgi_lambdas(baseline):
    assert baseline.client.stats()["backend"] in ("sock-nozygote", "runc", "docker")
    assert baseline.client.run("echo", {"x": [1, 2]}) == {"x": [1, 2]}
    assert baseline.client.request("GET", "hello", "/ada").body == b"<h1>Hello, ada!</h1>\n"
    second = baseline.client.request("POST", "echo", "", b"2")
    assert second.headers["x-sprout-start"] == "warm" and second.json() == 2


def test_reports_handler_errors_timeouts_and_memory(baseline):
    with pytest.raises(sprout.SproutError) as err:
        baseline.client.run("fail")
    assert err.value.code == "handler_exception" and "RuntimeError" in err.value.traceback
    baseline.deploy_source("badimport", "import nothing_here\ndef f(e):\n    return e\n")
    with pytest.raises(sprout.SproutError) as err:
        baseline.client.run("badimport")
    assert err.value.code == "load_error"
    baseline.deploy_test_lambda("sleepy")
    with pytest.raises(sprout.SproutError) as err:
        baseline.client.run("sleepy", {"seconds": 30})
    assert err.value.code == "timeout"
    baseline.deploy_test_lambda("hog")
    with pytest.raises(sprout.SproutError) as err:
        baseline.client.run("hog", {"mb": 512})
    assert err.value.code == "out_of_memory"
    assert baseline.client.run("echo", "alive") == "alive"


def test_runs_as_the_sandbox_user_with_read_only_code(baseline):
    baseline.deploy_test_lambda("probe")
    probe = baseline.client.run("probe")
    assert probe["uid"] == 65534 and probe["pid"] == 1
    assert probe["write_code"]["ok"] is False and probe["write_base"]["ok"] is False
    assert probe["write_tmp"]["ok"] is True
