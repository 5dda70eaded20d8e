"""Cloud calls from inside a sandbox: `sprout.invoke(name, event)` runs another lambda through
the worker, over the sandbox's own channel, with the limits and error codes of /run; calls
nest up to limits.max_invoke_depth; nothing but calls can be asked over the channel."""

import time

import pytest

CALLER = '''
import sprout

def f(event):
    if "pad" in event:  # an event bigger than any request may be, made here
        event["event"] = {"n": "x" * event["pad"]}
    try:
        return {"result": sprout.invoke(event["name"], event.get("event"))}
    except sprout.InvokeError as e:
        return {"status": e.status, "code": e.code, "message": e.message, "traceback": e.traceback}
'''

DOUBLE = '''
def f(event):
    return {"doubled": event["n"] * 2}
'''

FAIL = '''
def f(event):
    raise ValueError("no good: " + str(event))
'''

SLEEPY = '''
import time

def f(event):
    time.sleep(event["s"])
    return "woke"
'''

# Calls itself, one level deeper each time, and reports how deep it got before a call failed.
RECURSE = '''
import sprout

def f(event):
    depth = event["depth"]
    try:
        below = sprout.invoke("recurse", {"depth": depth + 1})
    except sprout.InvokeError as e:
        return {"deepest": depth, "code": e.code, "status": e.status}
    return below
'''

WSGI = '''
import json, sprout

def app(environ, start_response):
    event = json.loads(environ["wsgi.input"].read() or b"null")
    body = json.dumps({"via": "wsgi", "double": sprout.invoke("double", {"n": event["n"]})}).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]
'''


@pytest.fixture(scope="module")
def w(tmp_path_factory, sprout_bin):
    from conftest import Worker

    worker = Worker(tmp_path_factory.mktemp("worker"), {"limits": {"timeout_ms": 3000, "max_invoke_depth": 4, "max_body_mb": 1}})
    worker.start()
    for name, source in [("caller", CALLER), ("double", DOUBLE), ("fail", FAIL), ("sleepy", SLEEPY), ("recurse", RECURSE),
                         ("web", WSGI)]:
        worker.deploy_source(name, source)
    yield worker
    worker.stop()
    assert worker.leftovers() == []


def call(w, name, event=None, **extra):
    return w.client.run("caller", {"name": name, "event": event, **extra})


def test_a_lambda_calls_another(w):
    assert call(w, "double", {"n": 21}) == {"result": {"doubled": 42}}
    # Both were counted as invocations.
    metrics = w.client.metrics()
    assert 'sprout_invocations_total{lambda="double"' in metrics


def test_errors_are_the_apis(w):
    failed = call(w, "fail", {"x": 1})
    assert (failed["status"], failed["code"]) == (500, "handler_exception")
    assert "ValueError: no good" in failed["traceback"]
    missing = call(w, "nosuch")
    assert (missing["status"], missing["code"]) == (404, "lambda_not_found")
    bad = call(w, "../etc")
    assert (bad["status"], bad["code"]) == (400, "invalid_name")


def test_an_event_over_the_body_limit_is_refused(w):
    big = call(w, "double", pad=1 << 20)
    assert (big["status"], big["code"]) == (413, "payload_too_large")


def test_a_call_runs_within_its_callers_time_limit(w):
    began = time.monotonic()
    slow = call(w, "sleepy", {"s": 10})
    assert (slow["status"], slow["code"]) == (504, "timeout"), slow
    # The callee was cut off at the caller's limit (3 s), not its own.
    assert time.monotonic() - began < 4
    assert call(w, "sleepy", {"s": 0.1}) == {"result": "woke"}


def test_calls_nest_only_so_deep(w):
    out = w.client.run("recurse", {"depth": 0})
    # The outside request is depth 0; calls at depths 1-4 ran, the fifth was refused.
    assert out == {"deepest": 4, "code": "call_depth_exceeded", "status": 508}


def test_wsgi_apps_call_and_are_called(w):
    r = w.client.request("POST", "web", body=b'{"n": 5}')
    assert r.json() == {"via": "wsgi", "double": {"doubled": 10}}
    called = call(w, "web", {"n": 2})
    assert called == {"result": {"via": "wsgi", "double": {"doubled": 4}}}


OUTSIDE = '''
import sprout
try:
    sprout.invoke("double", {"n": 1})
    AT_LOAD = "called"
except RuntimeError as e:
    AT_LOAD = str(e)

def f(event):
    return AT_LOAD
'''

# Speaks the channel by hand: asks the worker to deploy, which a sandbox cannot ask for.
FORGER = '''
import gc, json, socket, struct

def f(event):
    sock = next(o for o in gc.get_objects() if isinstance(o, socket.socket) and o.family == socket.AF_UNIX and o.fileno() >= 0)
    head = json.dumps({"op": "deploy", "lambda": "double"}).encode()
    sock.sendall(struct.pack("<II", len(head), 4) + head + b"evil")
    return "sent"
'''


def test_only_calls_can_be_asked_and_only_while_serving(w):
    w.deploy_source("outside", OUTSIDE)
    assert w.client.run("outside") == "sprout.invoke can be called only while the lambda serves a request"
    w.deploy_source("forger", FORGER)
    before = w.client.get("double")
    with pytest.raises(Exception) as err:
        w.client.run("forger")
    assert getattr(err.value, "code", None) == "invalid_result", err.value
    # Nothing was deployed or replaced.
    assert w.client.get("double") == before
    assert call(w, "double", {"n": 1}) == {"result": {"doubled": 2}}
