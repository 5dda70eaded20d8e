"""`POST /map/<name>` (docs/offload.md, "The worker's part"): a function over many items, in
chunks over its sandboxes, the outcomes in the items' order. An item's own failure is its
outcome and runs once; the items of a sandbox that dies mid-chunk run again alone; an item
that runs out of memory alone is reported, never retried; WSGI apps and malformed bodies are
refused before any sandbox; a handler's channel call with `batch` is the same map."""

import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest

SQUARE = '''
def f(event):
    return {"i": event, "sq": event * event}
'''

# Says which item it runs (the logs show how many times each ran); item 13 raises.
FLAKY = '''
def f(event):
    print(f"item={event};")
    if event == 13:
        raise ValueError("unlucky 13")
    return event
'''

HOG = '''
def f(event):
    print(f"hog={event};")
    return len([bytearray(1 << 20) for _ in range(event)])  # touched: bytearray zero-fills
'''

SLOW = '''
import time

def f(event):
    print(f"slow={event};")
    time.sleep(0.1)
    return event
'''

WEB = '''
def app(environ, start_response):
    print("the app served a request")
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"web"]
'''

# Maps another lambda over the sandbox's channel (what sprout.map does inside a lambda).
MAPPER = '''
import json, sys

def f(event):
    body = event["raw"].encode() if "raw" in event else json.dumps(event["items"]).encode()
    header, reply = sys.modules["_sprout_sandbox"].call(event["name"], body, batch=True)
    return {"header": header, "outcomes": json.loads(reply) if reply else None}
'''


@pytest.fixture(scope="module")
def w(tmp_path_factory, sprout_bin):
    from conftest import Worker

    worker = Worker(tmp_path_factory.mktemp("worker"), {
        "limits": {"timeout_ms": 5000, "memory_mb": 64, "max_body_mb": 1},
        "instances": {"max_per_lambda": 4},
    })
    worker.start()
    for name, source in [("square", SQUARE), ("flaky", FLAKY), ("hog", HOG), ("web", WEB), ("mapper", MAPPER)]:
        worker.deploy_source(name, source)
    worker.deploy_source("declared-web", WEB, **{"ol.yaml": "environment:\n  OL_WSGI_ENTRY: app\n"})
    yield worker
    worker.stop()
    assert worker.leftovers() == []


def post_map(worker, name, body, query=""):
    """POST /map/<name>: (status, headers, JSON body)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"{worker.url}/map/{name}{query}", data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, reply.headers, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, err.headers, json.loads(err.read())


def squares(n):
    return [{"result": {"i": i, "sq": i * i}} for i in range(n)]


def runs_logged(worker, name, marker):
    """How many times the lambda printed `marker` (each run of an item prints it once)."""
    entries = worker.client.logs(name, limit=10000)
    return sum(e["message"].count(marker) for e in entries if e["type"] == "out")


def test_outcomes_come_back_in_order_in_chunks_the_worker_sizes(w):
    status, headers, outcomes = post_map(w, "square", list(range(500)))
    assert status == 200 and outcomes == squares(500)
    chunks = int(headers["x-sprout-map-chunks"])
    assert 4 <= chunks < 500, chunks  # single items first, then larger chunks
    assert headers["x-sprout-map-retries"] == "0"
    assert headers["x-sprout-worker"] and headers["content-type"] == "application/json"


@pytest.mark.parametrize("chunk, chunks", [(1, 500), (7, 72), (1024, 1)])
def test_a_fixed_chunk_size_is_kept(w, chunk, chunks):
    status, headers, outcomes = post_map(w, "square", list(range(500)), f"?chunk={chunk}")
    assert status == 200 and outcomes == squares(500)
    assert (int(headers["x-sprout-map-chunks"]), headers["x-sprout-map-retries"]) == (chunks, "0")


def test_items_are_any_json_and_an_empty_map_runs_nothing(w):
    items = [None, "é", {"nested": [1.5, True]}, [], 2**40]
    w.deploy_source("echo-items", "def f(event):\n    return event\n")
    status, headers, outcomes = post_map(w, "echo-items", items)
    assert status == 200 and outcomes == [{"result": item} for item in items]
    status, headers, outcomes = post_map(w, "echo-items", [])
    assert (status, outcomes, headers["x-sprout-map-chunks"]) == (200, [], "0")


def test_a_handler_exception_is_its_items_outcome_and_runs_once(w):
    status, headers, outcomes = post_map(w, "flaky", list(range(40)), "?chunk=8")
    assert status == 200
    failed = outcomes[13]
    assert failed["error"] == "handler_exception" and failed["message"] == "ValueError: unlucky 13"
    assert "raise ValueError" in failed["traceback"] and 'File "/handler/f.py"' in failed["traceback"]
    assert [o for i, o in enumerate(outcomes) if i != 13] == [{"result": i} for i in range(40) if i != 13]
    assert headers["x-sprout-map-retries"] == "0"
    time.sleep(0.3)  # the last chunk's output reaches the log
    assert runs_logged(w, "flaky", "item=13;") == 1
    assert runs_logged(w, "flaky", "item=14;") == 1
    metrics = w.client.metrics()
    assert re.search(r'sprout_map_items_total\{lambda="flaky",outcome="handler_exception"\} 1\n', metrics), metrics
    assert re.search(r'sprout_map_items_total\{lambda="flaky",outcome="ok"\} 39\n', metrics), metrics


def test_an_item_out_of_memory_alone_is_reported_and_not_run_again(w):
    status, headers, outcomes = post_map(w, "hog", [4, 500, 5], "?chunk=1")
    assert status == 200 and outcomes[0] == {"result": 4} and outcomes[2] == {"result": 5}
    assert outcomes[1]["error"] == "out_of_memory" and "64 MiB" in outcomes[1]["message"]
    assert headers["x-sprout-map-retries"] == "0"
    time.sleep(0.3)
    assert runs_logged(w, "hog", "hog=500;") == 1
    # In a chunk of several, the chunk is split and each item runs alone: the hog once more,
    # then it is reported.
    status, headers, outcomes = post_map(w, "hog", [6, 501, 7], "?chunk=3")
    assert status == 200 and [outcomes[0], outcomes[2]] == [{"result": 6}, {"result": 7}]
    assert outcomes[1]["error"] == "out_of_memory"
    assert (headers["x-sprout-map-chunks"], headers["x-sprout-map-retries"]) == ("4", "3")
    time.sleep(0.3)
    assert runs_logged(w, "hog", "hog=501;") == 2


def test_a_web_app_is_refused_as_not_a_function(w):
    for name in ("web", "declared-web"):  # f.py's app (its helper refuses); ol.yaml's (before any sandbox)
        status, _, body = post_map(w, name, [1, 2, 3])
        assert (status, body["error"], body["lambda"]) == (400, "not_a_function", name), body
        assert body["request_id"]
    time.sleep(0.3)
    assert runs_logged(w, "web", "the app served") == 0
    assert w.client.logs("declared-web") == []


@pytest.mark.parametrize("body", [b"{}", b'"items"', b"[1, 2", b"not json", b"", b"[1] [2]"])
def test_a_body_that_is_no_json_array_is_refused(w, body):
    status, _, reply = post_map(w, "square", body)
    assert (status, reply["error"]) == (400, "invalid_json"), reply


def test_requests_that_cannot_map_are_refused_before_any_sandbox(w):
    assert post_map(w, "nobody", [1])[0] == 404
    assert post_map(w, "nobody", [1])[2]["error"] == "lambda_not_found"
    status, _, reply = post_map(w, "square", [0] * 100_001)
    assert (status, reply["error"]) == (413, "payload_too_large") and "100000" in reply["message"]
    status, _, reply = post_map(w, "square", b"[" + b'"' + b"x" * (1 << 20) + b'"]')
    assert (status, reply["error"]) == (413, "payload_too_large")
    for query in ("?chunk=0", "?chunk=1025", "?chunk=x", "?size=3"):
        status, _, reply = post_map(w, "square", [1], query)
        assert (status, reply["error"]) == (400, "invalid_request"), query
    request = urllib.request.Request(f"{w.url}/map/square", method="GET")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=30)
    assert err.value.code == 405  # open without a token, like /run: not 401


def test_a_lambda_maps_another_over_its_channel(w):
    status, _, outcomes = post_map(w, "mapper", [{"name": "square", "items": list(range(300))}])
    assert status == 200
    reply = outcomes[0]["result"]
    assert reply["header"]["status"] == 200 and reply["header"]["request_id"]
    assert reply["header"]["chunks"] >= 1 and reply["header"]["retries"] == 0
    assert reply["outcomes"] == squares(300)
    # Maps within a map: each of the mapper's items maps square in turn.
    status, _, outcomes = post_map(w, "mapper", [{"name": "square", "items": [3]}, {"name": "square", "items": []}])
    assert status == 200 and [o["result"]["outcomes"] for o in outcomes] == [squares(4)[3:], []]
    # An item's failure comes back as its outcome there too.
    reply = w.client.run("mapper", {"name": "flaky", "items": [12, 13]})
    assert reply["outcomes"][0] == {"result": 12} and reply["outcomes"][1]["error"] == "handler_exception"
    # Refusals come back as the call's error, with their status.
    for event, status, code in [({"name": "web", "items": [1]}, 400, "not_a_function"),
                                ({"name": "square", "raw": "{}"}, 400, "invalid_json"),
                                ({"name": "nobody", "items": [1]}, 404, "lambda_not_found")]:
        reply = w.client.run("mapper", event)
        assert (reply["header"]["status"], reply["header"]["error"], reply["outcomes"]) == (status, code, None), reply


def sandbox_groups(worker):
    """The worker's sandbox cgroups (pids hierarchy) that hold processes: {group: [pid]}."""
    root = f"/sys/fs/cgroup/pids/{worker.cgroup_names[0]}"
    groups = {}
    for group in os.listdir(root):
        procs = os.path.join(root, group, "cgroup.procs")
        if group.startswith("sb-") and os.path.exists(procs):
            pids = [int(p) for p in open(procs).read().split()]
            if pids:
                groups[group] = pids
    return groups


def test_the_items_of_a_sandbox_killed_mid_chunk_run_again(make_worker):
    from conftest import targz

    worker = make_worker(instances={"max_per_lambda": 1})
    worker.client.upload("slow", targz({"f.py": SLOW}))
    answer = {}
    mapping = threading.Thread(target=lambda: answer.update(reply=post_map(worker, "slow", list(range(20)), "?chunk=10")))
    mapping.start()
    deadline = time.time() + 30
    while runs_logged(worker, "slow", "slow=2;") == 0:  # the first chunk is under way, 7 items to go
        assert time.time() < deadline, "the map never started"
        time.sleep(0.02)
    (group, pids), = sandbox_groups(worker).items()  # its one sandbox
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    mapping.join(60)
    status, headers, outcomes = answer["reply"]
    assert status == 200 and outcomes == [{"result": i} for i in range(20)]
    assert int(headers["x-sprout-map-retries"]) >= 1
    assert headers["x-sprout-map-retries"] == "10"  # the killed chunk's items, each alone
    assert headers["x-sprout-map-chunks"] == "12"
    assert runs_logged(worker, "slow", "slow=0;") == 2 and runs_logged(worker, "slow", "slow=15;") == 1
