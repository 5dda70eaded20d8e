"""The OpenLambda HTTP API against a real worker: run, registry, status, stats, metrics."""

import concurrent.futures
import json
import time
import urllib.request

import pytest

import sprout
from conftest import LAMBDAS


def test_echo_returns_the_event(worker):
    assert worker.client.run("echo", {"hello": "world", "n": [1, 2.5, None]}) == {"hello": "world", "n": [1, 2.5, None]}


def test_empty_body_is_a_null_event(worker):
    response = worker.client.request("POST", "echo", "")
    assert response.status == 200 and response.json() is None


def test_non_json_body_is_a_clear_400(worker):
    response = worker.client._call("POST", "/run/echo", b"{not json")
    assert response.status == 400
    body = json.loads(response.body)
    assert body["error"] == "invalid_json" and body["lambda"] == "echo"


def test_warm_sandbox_is_reused_and_keeps_module_state(worker):
    worker.deploy_test_lambda("counter")
    first = worker.client.request("POST", "counter", "", b"null")
    second = worker.client.request("POST", "counter", "", b"null")
    assert first.headers["x-sprout-start"] == "cold"
    assert second.headers["x-sprout-start"] == "warm"
    assert second.headers["x-sprout-sandbox"] == first.headers["x-sprout-sandbox"]
    assert second.json()["calls"] == first.json()["calls"] + 1


def test_wsgi_app_receives_method_path_query_headers_and_body(worker):
    home = worker.client.request("GET", "hello", "/")
    assert home.status == 200 and home.body == b"<h1>Hello, world!</h1>\n"
    assert home.headers["Content-Type"] == "text/html; charset=utf-8"
    named = worker.client.request("GET", "hello", "/ada")
    assert named.body == b"<h1>Hello, ada!</h1>\n"
    missing = worker.client.request("GET", "hello", "/no-such-page")
    assert missing.status == 404 and missing.body == b"no such page\n"
    posted = worker.client.request("POST", "hello", "/", b"form=data", {"Content-Type": "application/x-www-form-urlencoded"})
    assert posted.json() == {"received": "form=data"}


def test_wsgi_environ_follows_pep_3333(worker):
    source = (
        "import json\n"
        "def app(environ, start_response):\n"
        "    keys = ['REQUEST_METHOD', 'SCRIPT_NAME', 'PATH_INFO', 'QUERY_STRING', 'CONTENT_TYPE',\n"
        "            'CONTENT_LENGTH', 'HTTP_X_CUSTOM', 'SERVER_NAME', 'SERVER_PORT']\n"
        "    body = environ['wsgi.input'].read(int(environ.get('CONTENT_LENGTH') or 0))\n"
        "    out = {k: environ.get(k) for k in keys}\n"
        "    out['body'] = body.decode()\n"
        "    start_response('201 Created', [('Content-Type', 'application/json'), ('X-Made-By', 'wsgi')])\n"
        "    return [json.dumps(out).encode()]\n"
    )
    worker.deploy_source("environ", source)
    r = worker.client.request("PUT", "environ", "/a/b%20c?x=1&y=2", b"payload",
                              {"Content-Type": "text/plain", "X-Custom": "yes"})
    assert r.status == 201 and r.headers["X-Made-By"] == "wsgi"
    env = r.json()
    assert env["REQUEST_METHOD"] == "PUT"
    assert env["SCRIPT_NAME"] == "/run/environ"
    assert env["PATH_INFO"] == "/a/b c"
    assert env["QUERY_STRING"] == "x=1&y=2"
    assert env["CONTENT_TYPE"] == "text/plain" and env["CONTENT_LENGTH"] == "7"
    assert env["HTTP_X_CUSTOM"] == "yes" and env["body"] == "payload"
    assert env["SERVER_NAME"] == "127.0.0.1" and env["SERVER_PORT"] == str(worker.port)


def test_failing_lambda_gives_500_with_traceback(worker):
    with pytest.raises(sprout.SproutError) as err:
        worker.client.run("fail", {"x": 1})
    e = err.value
    assert e.status == 500 and e.code == "handler_exception"
    assert "RuntimeError: this lambda always fails" in e.message
    assert 'File "/handler/f.py", line 5, in f' in e.traceback
    assert "helper.py" not in e.traceback  # the runtime's own frames are not shown
    assert worker.client.run("echo", 1) == 1  # and the worker goes on serving


def test_lambda_that_fails_to_load_gives_500_load_error(worker):
    worker.deploy_source("badimport", "import no_such_module\n\ndef f(event):\n    return 1\n")
    with pytest.raises(sprout.SproutError) as err:
        worker.client.run("badimport")
    assert err.value.status == 500 and err.value.code == "load_error"
    assert "ModuleNotFoundError" in err.value.message and "no_such_module" in err.value.traceback
    worker.deploy_source("noentry", "x = 1\n")
    with pytest.raises(sprout.SproutError) as err:
        worker.client.run("noentry")
    assert err.value.code == "load_error" and "neither f(event) nor a WSGI" in err.value.message


def test_result_that_is_not_json_gives_500(worker):
    worker.deploy_source("badresult", "def f(event):\n    return {1, 2}\n")
    with pytest.raises(sprout.SproutError) as err:
        worker.client.run("badresult")
    assert err.value.status == 500 and err.value.code == "invalid_result"


def test_unknown_lambda_is_404(worker):
    with pytest.raises(sprout.SproutError) as err:
        worker.client.run("nosuchlambda")
    assert err.value.status == 404 and err.value.code == "lambda_not_found"
    with pytest.raises(sprout.SproutError) as err:
        worker.client.run("bad%2Fname")
    assert err.value.status == 404


def test_oversized_request_body_is_413(make_worker):
    w = make_worker(limits={"max_body_mb": 1})
    w.client.deploy(str(LAMBDAS / "sleepy"), name="sleepy")
    big = b'"' + b"x" * (1 << 20) + b'"'
    r = w.client._call("POST", "/run/sleepy", big)
    assert r.status == 413 and json.loads(r.body)["error"] == "payload_too_large"
    # The unread rest of the body ends the connection, and the reply says so: a client that
    # reused it would race the close.
    assert r.headers["Connection"] == "close"
    assert w.client.run("sleepy", {"seconds": 0})["slept"] == 0


def test_unknown_endpoint_and_method(worker):
    r = worker.client._call("GET", "/nowhere")
    assert r.status == 404 and json.loads(r.body)["error"] == "not_found"
    r = worker.client._call("PATCH", "/registry")
    assert r.status == 405 and json.loads(r.body)["error"] == "method_not_allowed"


def test_registry_lists_shows_replaces_and_deletes(worker):
    worker.deploy_source("versioned", "def f(event):\n    return 'v1'\n")
    assert "versioned" in worker.client.list()
    meta = worker.client.get("versioned")
    assert meta["name"] == "versioned" and len(meta["sha256"]) == 64 and meta["files"] == 1
    assert worker.client.run("versioned") == "v1"
    # New code takes effect for the next request, without a restart.
    new = worker.deploy_source("versioned", "def f(event):\n    return 'v2'\n")
    assert new["version"] > meta["version"]
    assert worker.client.run("versioned") == "v2"
    assert worker.client.delete("versioned") == {"deleted": "versioned"}
    assert "versioned" not in worker.client.list()
    with pytest.raises(sprout.SproutError) as err:
        worker.client.run("versioned")
    assert err.value.code == "lambda_not_found"
    with pytest.raises(sprout.SproutError) as err:
        worker.client.delete("versioned")
    assert err.value.status == 404


def test_old_code_directories_are_removed_once_unused(worker):
    for i in range(3):
        worker.deploy_source("churn", f"def f(event):\n    return {i}\n")
        assert worker.client.run("churn") == i
    time.sleep(0.5)
    versions = [p.name for p in (worker.dir / "registry").iterdir() if p.name.startswith("churn@") and p.is_dir()]
    assert len(versions) == 1, versions


def test_status_pid_stats_and_metrics(worker):
    assert worker.client.status() == "ready\n"
    assert int(worker.client._call("GET", "/pid").body) == worker.process.pid
    worker.client.run("echo", 1)
    stats = worker.client.stats()
    assert stats["backend"] == "sock"
    assert stats["invocations"] >= 1 and stats["cold_starts"] >= 1
    assert stats["latency"]["cold"]["p50_ms"] > 0
    assert set(stats["sandboxes"]) == {"starting", "busy", "idle"}
    assert stats["backend_counters"]["cgroups_reused"] + stats["backend_counters"]["cgroups_created"] >= 1
    assert "echo" in stats["lambdas"]["per_lambda"]
    text = worker.client.metrics()
    for name in ("sprout_invocations_total", "sprout_cold_starts_total", "sprout_request_duration_seconds_bucket",
                 "sprout_sandboxes{state=\"idle\",backend=\"sock\"}", "sprout_errors_total", "sprout_cgroups_reused_total"):
        assert name in text, name
    assert 'lambda="echo"' in text


def test_errors_are_counted_by_kind(worker):
    with pytest.raises(sprout.SproutError):
        worker.client.run("nosuchlambda")
    assert worker.client.stats()["errors"].get("lambda_not_found", 0) >= 1
    assert 'sprout_errors_total{kind="lambda_not_found"}' in worker.client.metrics()


def test_queued_requests_are_served_by_several_sandboxes(make_worker):
    w = make_worker(instances={"max_per_lambda": 4})
    w.client.deploy(str(LAMBDAS / "sleepy"), name="sleepy")
    started = time.time()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda _: w.client.request("POST", "sleepy", "", b'{"seconds": 0.5}'), range(8)))
    elapsed = time.time() - started
    assert [r.status for r in replies] == [200] * 8
    sandboxes = {r.headers["x-sprout-sandbox"] for r in replies}
    assert 2 <= len(sandboxes) <= 4, sandboxes  # served concurrently, never past the cap
    assert elapsed < 8 * 0.5, elapsed  # not one after another
    assert w.client.stats()["lambdas"]["per_lambda"]["sleepy"]["sandboxes"] <= 4


def test_a_full_queue_is_429(make_worker):
    w = make_worker(instances={"max_per_lambda": 1, "queue_depth": 1})
    w.client.deploy(str(LAMBDAS / "sleepy"), name="sleepy")

    def call(_):
        try:
            w.client.run("sleepy", {"seconds": 1})
            return 200
        except sprout.SproutError as e:
            return (e.status, e.code)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(call, range(4)))
    assert outcomes.count(200) == 2, outcomes  # one running, one queued
    assert outcomes.count((429, "queue_full")) == 2, outcomes
    assert w.client.run("sleepy", {"seconds": 0})["slept"] == 0


def test_cold_start_per_request_when_keep_warm_is_off(make_worker):
    w = make_worker(instances={"keep_warm": False})
    w.client.deploy(str(LAMBDAS / "counter"), name="counter")
    starts = [w.client.request("POST", "counter", "", b"null").headers["x-sprout-start"] for _ in range(3)]
    assert starts == ["cold"] * 3
    assert [w.client.run("counter")["calls"] for _ in range(2)] == [1, 1]


def test_python_client_and_cli_deploy_and_invoke(worker, sprout_bin):
    out = worker.sprout("deploy", LAMBDAS / "counter", "--name", "clicounter", "--url", worker.url)
    assert json.loads(out.stdout)["name"] == "clicounter"
    out = worker.sprout("invoke", "echo", '{"via": "cli"}', "--url", worker.url)
    assert json.loads(out.stdout) == {"via": "cli"}
    failed = worker.sprout("invoke", "fail", "1", "--url", worker.url, check=False)
    assert failed.returncode == 1 and "handler_exception" in failed.stderr and "RuntimeError" in failed.stderr


def test_http_keep_alive_and_plain_urllib(worker):
    request = urllib.request.Request(worker.url + "/run/echo", data=b'"plain"', method="POST")
    with urllib.request.urlopen(request) as reply:
        assert reply.status == 200 and json.loads(reply.read()) == "plain"
        assert reply.headers["Content-Type"] == "application/json"
