"""Function logs on a real worker: a handler's output kept per lambda and tagged with its
request, START/ERROR/REPORT entries, request ids on every reply, following a log, the
per-lambda bounds under a flood, bad queries, and logs kept across a restart."""

import json
import threading
import time

import pytest
import requests

import sprout

PRINTER = """
import logging, sys
import sprout
print("loading", flush=True)
log = logging.getLogger("printer")

def f(event):
    print("out", event)
    print("err", event, file=sys.stderr)
    log.info("info %s", event)
    return {"request_id": sprout.request_id()}
"""

FAILING = """
def f(event):
    print("about to fail")
    return 1 / 0
"""

FLOOD = """
import sys
LINE = "x" * 99 + "\\n"

def f(event):
    sys.stdout.write(LINE * (event * 10_000))   # event MB
    sys.stdout.flush()
    return event
"""

SLOW = """
import time
def f(event):
    print("before the limit", flush=True)
    time.sleep(30)
"""


def token_header(worker):
    return {"Authorization": f"Bearer {(worker.dir / 'api-token').read_text().strip()}"}


def entries(worker, name, **query):
    return worker.client.logs(name, **query)


def wait_for(what, check, timeout=30):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"{what}: not seen in {timeout} s (last: {last!r})")


def test_a_requests_output_is_kept_with_its_id_between_start_and_report(worker):
    version = worker.deploy_source("printer", PRINTER)["version"]
    reply = requests.post(f"{worker.url}/run/printer", json="one", timeout=60)
    assert reply.status_code == 200
    request_id = reply.headers["X-Sprout-Request-Id"]
    assert len(request_id) == 16 and reply.json() == {"request_id": request_id}
    mine = entries(worker, "printer", request=request_id)
    kinds = [(e["type"], e["message"]) for e in mine]
    assert kinds[0][0] == "start" and kinds[0][1] == f"START RequestId: {request_id} Version: {version}"
    assert ("out", "out one") in kinds and ("out", "err one") in kinds
    assert ("out", "[INFO] printer: info one") in kinds, kinds
    report = mine[-1]
    assert report["type"] == "report" and report["outcome"] == "ok" and report["start"] == "cold"
    assert report["duration_ms"] > 0 and report["billed_ms"] >= 1 and report["init_ms"] > 0
    assert report["max_memory_mb"] > 0, report  # the sandbox cgroup's peak
    assert report["message"].startswith(f"REPORT RequestId: {request_id} Duration: ")
    assert all(e["request_id"] == request_id and e["lambda"] == "printer" and e["sandbox"] for e in mine)
    assert [e["seq"] for e in mine] == sorted(e["seq"] for e in mine)
    # What it printed while loading belongs to no request.
    everything = entries(worker, "printer")
    assert {"type": "out", "message": "loading", "request_id": None}.items() <= everything[0].items()
    # The same entries by id alone, whatever the lambda.
    assert worker.client.request_logs(request_id) == mine


def test_a_warm_request_is_reported_warm_and_limit_and_since_pick_the_newest(worker):
    worker.deploy_source("warmth", PRINTER)
    ids = [requests.post(f"{worker.url}/run/warmth", json=i, timeout=60).headers["X-Sprout-Request-Id"] for i in range(3)]
    reports = [e for e in entries(worker, "warmth", limit=1000) if e["type"] == "report"]
    assert [r["request_id"] for r in reports] == ids
    assert [r["start"] for r in reports] == ["cold", "warm", "warm"]
    assert "init_ms" not in reports[1]
    last2 = entries(worker, "warmth", limit=2)
    assert len(last2) == 2 and last2[-1]["type"] == "report" and last2[-1]["request_id"] == ids[-1]
    in_the_hour = [e["request_id"] for e in entries(worker, "warmth", since="1h", limit=1000) if e["type"] == "report"]
    assert in_the_hour == ids
    assert entries(worker, "warmth", since=str(time.time() + 60)) == []


def test_a_failure_is_logged_and_its_reply_names_the_request(worker):
    worker.deploy_source("failing", FAILING)
    reply = requests.post(f"{worker.url}/run/failing", json=1, timeout=60)
    assert reply.status_code == 500
    body = reply.json()
    assert body["error"] == "handler_exception" and body["request_id"] == reply.headers["X-Sprout-Request-Id"]
    mine = entries(worker, "failing", request=body["request_id"])
    assert [e["type"] for e in mine] == ["start", "out", "error", "report"]
    error = mine[2]
    assert error["message"].startswith(f"ERROR RequestId: {body['request_id']} handler_exception:")
    assert "ZeroDivisionError" in error["traceback"]
    assert mine[3]["outcome"] == "handler_exception"
    # A request that reaches no sandbox is logged too.
    worker.deploy_source("broken", "import nowhere_to_be_found\n\ndef f(event):\n    return 1\n")
    reply = requests.post(f"{worker.url}/run/broken", json=1, timeout=60)
    body = reply.json()
    assert body["error"] == "load_error"
    (logged,) = [e for e in entries(worker, "broken") if e["type"] == "error"]
    assert logged["request_id"] == body["request_id"] and "nowhere_to_be_found" in logged["traceback"]


def test_every_reply_carries_a_request_id_and_every_error_body_too(worker):
    for method, path, headers in [("GET", "/status", {}), ("GET", "/stats", token_header(worker)),
                                  ("GET", "/stats", {}), ("GET", "/nowhere", token_header(worker)),
                                  ("POST", "/run/no-such-lambda", {}), ("GET", "/logs/echo?limit=0", token_header(worker))]:
        reply = requests.request(method, worker.url + path, headers=headers, timeout=60)
        request_id = reply.headers.get("X-Sprout-Request-Id", "")
        assert len(request_id) == 16, (path, reply.headers)
        if reply.status_code >= 400:
            assert reply.json()["request_id"] == request_id, (path, reply.text)
    ids = {requests.get(f"{worker.url}/status", timeout=60).headers["X-Sprout-Request-Id"] for _ in range(20)}
    assert len(ids) == 20


def test_a_handlers_own_error_body_is_left_alone(worker):
    app = ("def app(environ, start_response):\n"
           "    start_response('404 Not Found', [('Content-Type', 'application/json')])\n"
           "    return [b'{\"mine\": true}']\n")
    worker.deploy_source("own404", app)
    reply = requests.get(f"{worker.url}/run/own404/x", timeout=60)
    assert reply.status_code == 404 and reply.json() == {"mine": True}
    assert reply.headers["X-Sprout-Request-Id"]
    assert "sandbox" in reply.headers["Content-Security-Policy"]


def test_bad_log_queries_are_refused_with_the_reason(worker):
    for query, word in [("since=yesterday", "since"), ("limit=0", "limit"), ("limit=100000", "limit"),
                        ("request=a%20b", "request"), ("follow=maybe", "follow")]:
        reply = requests.get(f"{worker.url}/logs/echo?{query}", headers=token_header(worker), timeout=60)
        assert reply.status_code == 400, query
        assert reply.json()["error"] == "invalid_request" and word in reply.json()["message"], reply.text
    reply = requests.get(f"{worker.url}/logs/never-deployed", headers=token_header(worker), timeout=60)
    assert reply.status_code == 404 and reply.json()["error"] == "lambda_not_found"
    reply = requests.get(f"{worker.url}/logs", headers=token_header(worker), timeout=60)
    assert reply.status_code == 400
    assert requests.get(f"{worker.url}/logs/echo", timeout=60).status_code == 401
    assert worker.client.request_logs("0123456789abcdef") == []


def test_following_a_log_streams_new_entries(worker):
    worker.deploy_source("followed", PRINTER)
    url = f"{worker.url}/logs/followed?follow=1&limit=1"
    seen = []
    with requests.get(url, headers=token_header(worker), stream=True, timeout=60) as stream:
        assert stream.headers["Content-Type"] == "application/x-ndjson"

        def read():
            for line in stream.iter_lines():
                if line:
                    seen.append(json.loads(line))
                if any(e["type"] == "report" for e in seen):
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        request_id = requests.post(f"{worker.url}/run/followed", json="live", timeout=60).headers["X-Sprout-Request-Id"]
        reader.join(30)
    assert ("out", "out live") in [(e["type"], e["message"]) for e in seen], seen
    assert seen[-1]["type"] == "report" and seen[-1]["request_id"] == request_id


def test_a_flood_stays_within_its_lambdas_bounds_and_leaves_others_alone(make_worker):
    w = make_worker(logs={"rate_kb_s": 64, "burst_kb": 256, "max_mb": 1, "memory_kb": 64})
    w.deploy_source("quiet", PRINTER)
    w.deploy_source("flood", FLOOD)
    quiet_id = requests.post(f"{w.url}/run/quiet", json="before", timeout=60).headers["X-Sprout-Request-Id"]
    for _ in range(5):
        assert w.client.run("flood", 5) == 5  # 5 MB of output each
    # The flood's files stay within max_mb (plus one line per file).
    files = list((w.dir / "logs" / "flood").glob("log*.jsonl"))
    assert sum(f.stat().st_size for f in files) <= (1 << 20) + 4 * 1024, [(f.name, f.stat().st_size) for f in files]
    body = requests.get(f"{w.url}/logs/flood?limit=10000", headers=token_header(w), timeout=60).json()
    assert body["dropped"]["lines"] > 200_000, body["dropped"]
    dropped = [e for e in body["entries"] if e["type"] == "dropped"]
    assert dropped and "logs.rate_kb_s" in dropped[-1]["message"]
    reports = [e for e in body["entries"] if e["type"] == "report"]
    assert reports and all(r["outcome"] == "ok" for r in reports)
    assert any(r.get("lines", 0) > 0 for r in reports) and "Output Dropped" in reports[-1]["message"]
    # The quiet lambda's lines are still there, and it still answers.
    assert ("out", "out before") in [(e["type"], e["message"]) for e in entries(w, "quiet", request=quiet_id)]
    assert w.client.run("quiet", "after")["request_id"]
    metrics = w.client.metrics()
    assert 'sprout_log_dropped_lines_total{lambda="flood"}' in metrics


def test_a_timeout_keeps_what_was_printed_and_reports_it(make_worker):
    w = make_worker(limits={"timeout_ms": 1000})
    w.deploy_source("slow", SLOW)
    with pytest.raises(sprout.SproutError) as failed:
        w.client.run("slow", None)
    assert failed.value.code == "timeout" and failed.value.request_id
    mine = entries(w, "slow", request=failed.value.request_id)
    assert ("out", "before the limit") in [(e["type"], e["message"]) for e in mine]
    assert mine[-1]["type"] == "report" and mine[-1]["outcome"] == "timeout"


def test_logs_outlive_a_restart_and_a_deleted_lambda(make_worker):
    w = make_worker()
    w.deploy_source("kept", PRINTER)
    request_id = requests.post(f"{w.url}/run/kept", json="first", timeout=60).headers["X-Sprout-Request-Id"]
    w.client.delete("kept")
    w.stop()
    w.start()
    mine = entries(w, "kept", request=request_id)
    assert ("out", "out first") in [(e["type"], e["message"]) for e in mine]
    last_seq = entries(w, "kept")[-1]["seq"]
    w.deploy_source("kept", PRINTER)
    w.client.run("kept", "second")
    newest = entries(w, "kept", limit=1000)
    assert newest[-1]["seq"] > last_seq and newest[-1]["type"] == "report"
