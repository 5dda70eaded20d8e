"""User leases (`/leases`, crates/worker/src/lease_routes.rs) and `sprout.Lease`
(python/sprout/lease.py): N sandboxes of a lambda held for a client-side object, state kept
per part, released by DELETE, collection, exit or idle timeout, counted against the
worker's bounds; lost parts and bad requests."""

import gc
import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import sprout
from conftest import targz

PYTHON_DIR = str(Path(__file__).resolve().parents[2] / "python")

COUNTER = textwrap.dedent("""
    import os, time
    TOKEN = os.urandom(8).hex()   # tells this sandbox from another
    count = 0

    def f(event):
        global count
        event = event or {}
        if event.get("die"):
            os._exit(3)
        time.sleep(event.get("sleep", 0))
        count += event.get("add", 0)
        return {"count": count, "token": TOKEN}
""")

WEBAPP = "def app(environ, start_response):\n    start_response('200 OK', [])\n    return [b'hi']\n"


def leases(worker):
    return json.loads(worker.client._check(worker.client._call("GET", "/leases")).body)


def sandboxes(worker, name="counter"):
    return worker.client.stats()["lambdas"]["per_lambda"].get(name, {}).get("sandboxes", 0)


def wait_for(condition, timeout=15, what="the condition"):
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"{what} never held"
        time.sleep(0.1)


def raw(worker, method, path, body=None, token=True):
    headers = {"Content-Type": "application/json"}
    if not token:
        headers["Authorization"] = "Bearer wrong"
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    reply = worker.client._call(method, path, data, headers)
    return reply.status, json.loads(reply.body or b"null")


@pytest.fixture(scope="module")
def w(tmp_path_factory, sprout_bin):
    """Idle sandboxes are reaped after a second; a lambda may have 3 sandboxes, and a request
    waits at most 3 s."""
    from conftest import Worker

    worker = Worker(tmp_path_factory.mktemp("worker"), {"instances": {"idle_timeout_s": 1, "max_per_lambda": 3},
                                                         "limits": {"timeout_ms": 3000}})
    worker.start()
    worker.client.upload("counter", targz({"f.py": COUNTER}))
    worker.client.upload("webapp", targz({"f.py": WEBAPP, "ol.yaml": "environment:\n  OL_WSGI_ENTRY: app\n"}))
    yield worker
    worker.stop()
    assert worker.leftovers() == [], f"worker left {worker.leftovers()}"


@pytest.fixture(autouse=True)
def no_lease_left(request):
    yield
    if "w" in request.fixturenames:
        worker = request.getfixturevalue("w")
        for lease in leases(worker):
            raw(worker, "DELETE", f"/leases/{lease['lease']}")


def test_state_is_kept_per_part_and_leased_sandboxes_are_never_reaped(w):
    with sprout.Lease("counter", 2, client=w.client) as lease:
        assert lease.parts == 2 and len(lease) == 2 and lease.lambda_name == "counter"
        a, b = lease.call(0, {"add": 1}), lease.call(1, {"add": 10})
        assert a["token"] != b["token"], "two sandboxes"
        assert lease.call(0, {"add": 2}) == {"count": 3, "token": a["token"]}
        listed = leases(w)
        assert [(x["lease"], x["lambda"], x["parts"], x["idle_timeout_s"]) for x in listed] == [(lease.id, "counter", 2, 60)]
        stats = w.client.stats()
        assert stats["leases"] == {"count": 1, "parts": 2}
        counter = stats["lambdas"]["per_lambda"]["counter"]
        assert counter["sandboxes"] == 2 and counter["idle"] == 0
        time.sleep(3)  # idle_timeout_s is 1: an idle sandbox would be reaped by now
        assert lease.call(1, {"add": 1}) == {"count": 11, "token": b["token"]}
        assert lease.call(0) == {"count": 3, "token": a["token"]}
        # A /run of the lambda gets a sandbox of its own, never a leased one.
        assert w.client.run("counter", {"add": 100})["token"] not in (a["token"], b["token"])
    assert lease.released and leases(w) == []
    assert w.client.stats()["leases"] == {"count": 0, "parts": 0}
    wait_for(lambda: sandboxes(w) == 0, what="the leased sandboxes gone")
    with pytest.raises(sprout.SproutError) as e:
        lease.call(0)
    assert e.value.code == "lease_not_found"


def test_a_calls_reply_and_errors_are_as_runs(w):
    lease = sprout.Lease("counter", 1, client=w.client)
    try:
        reply = w.client._call("POST", f"/leases/{lease.id}/0", b'{"add": 5}', {"Content-Type": "application/json"})
        assert reply.status == 200 and json.loads(reply.body)["count"] == 5
        assert reply.headers["x-sprout-start"] == "cold" and reply.headers["x-sprout-lease-part"] == "0"
        assert reply.headers["x-sprout-request-id"]
        reply = w.client._call("POST", f"/leases/{lease.id}/0", b'{"add": 1}', {"Content-Type": "application/json"})
        assert reply.headers["x-sprout-start"] == "warm"
        # The handler's own failure answers as /run's, and the part keeps its state.
        with pytest.raises(sprout.SproutError) as e:
            lease.call(0, {"add": "x"})
        assert e.value.status == 500 and e.value.code == "handler_exception" and "TypeError" in e.value.traceback
        status, body = raw(w, "POST", f"/leases/{lease.id}/0", b"not json")
        assert status == 400 and body["error"] == "invalid_json"
        assert lease.call(0)["count"] == 6
        # Logged and counted as invocations.
        assert w.client.stats()["lambda_invocations"]["counter"]["invocations"] >= 4
    finally:
        lease.release()
    lease.release()  # again: nothing


def test_released_when_the_object_is_collected(w):
    lease = sprout.Lease("counter", 2, client=w.client)
    lease.call(1, {"add": 1})
    assert len(leases(w)) == 1 and sandboxes(w) == 2
    del lease
    gc.collect()
    assert leases(w) == []
    wait_for(lambda: sandboxes(w) == 0, what="the collected lease's sandboxes gone")


def client_process(worker, code):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, SPROUT_TOKEN=worker.client.token() or "", SPROUT_URL=worker.url)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, stdout=subprocess.PIPE, text=True)


def test_released_when_its_client_exits_without_releasing(w):
    process = client_process(w, """
        import sprout
        lease = sprout.Lease("counter", 1)
        print(lease.id, lease.call(0, {"add": 1})["count"], flush=True)
    """)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    lease_id, count = out.split()
    assert count == "1"
    assert lease_id not in [x["lease"] for x in leases(w)]
    assert leases(w) == []
    wait_for(lambda: sandboxes(w) == 0, what="the exited client's sandboxes gone")


def test_a_sigkilled_clients_lease_expires_after_its_idle_timeout(w):
    process = client_process(w, """
        import sprout, time
        lease = sprout.Lease("counter", 1, idle_timeout=2)
        print(lease.id, flush=True)
        time.sleep(600)
    """)
    try:
        lease_id = process.stdout.readline().split()[0]
        time.sleep(4)  # twice the timeout: its keepalives hold it
        assert [x["lease"] for x in leases(w)] == [lease_id]
        assert leases(w)[0]["idle_s"] < 2
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    killed = time.time()
    wait_for(lambda: leases(w) == [], timeout=10, what="the lease expired")
    assert time.time() - killed < 4.5
    status, body = raw(w, "POST", f"/leases/{lease_id}/keepalive")
    assert status == 404 and body["error"] == "lease_not_found"
    wait_for(lambda: sandboxes(w) == 0, what="the expired lease's sandboxes gone")


def test_a_lease_counts_against_max_per_lambda(w):
    lease = sprout.Lease("counter", 3, client=w.client)  # every sandbox the lambda may have
    try:
        started = time.time()
        with pytest.raises(sprout.SproutError) as e:
            w.client.run("counter", {})
        assert e.value.code == "queue_timeout" and time.time() - started >= 2.5, "the run waited for a sandbox"
        # A second lease finds no room in time either; it keeps none of what it got.
        status, body = raw(w, "POST", "/leases/counter", {"parts": 1})
        assert status == 503 and body["error"] == "queue_timeout"
        assert [x["lease"] for x in leases(w)] == [lease.id] and sandboxes(w) == 3
        # A run waiting when the lease goes gets its room.
        import threading

        answer = {}
        runner = threading.Thread(target=lambda: answer.update(r=w.client.run("counter", {"add": 7})))
        runner.start()
        time.sleep(0.5)
        lease.release()
        runner.join(30)
        assert answer["r"]["count"] == 7
    finally:
        lease.release()


def test_a_part_whose_sandbox_died_is_lost_and_not_replaced(w):
    with sprout.Lease("counter", 2, client=w.client) as lease:
        kept = lease.call(1, {"add": 4})
        with pytest.raises(sprout.SproutError) as e:
            lease.call(0, {"die": True})
        assert e.value.status == 502 and e.value.code == "lease_part_lost" and e.value.body["cause"] == "sandbox_crashed"
        with pytest.raises(sprout.SproutError) as e:
            lease.call(0, {"add": 1})
        assert e.value.status == 502 and e.value.code == "lease_part_lost" and e.value.body["part"] == 0
        assert lease.call(1) == kept, "the other part lives on"
        assert leases(w)[0]["lost_parts"] == [0]
        assert sandboxes(w) == 1


def test_bad_requests_are_refused_with_clear_errors(w):
    checks = [
        ("POST", "/leases/counter", {"parts": 0}, 400, "invalid_request", "parts must be 1 to 3"),
        ("POST", "/leases/counter", {"parts": 4}, 400, "invalid_request", "max_per_lambda"),
        ("POST", "/leases/counter", {"parts": 1, "idle_timeout_s": 0}, 400, "invalid_request", "idle_timeout_s"),
        ("POST", "/leases/counter", {"parts": 1, "idle_timeout_s": 3601}, 400, "invalid_request", "idle_timeout_s"),
        ("POST", "/leases/counter", {"part": 1}, 400, "invalid_request", "unknown lease field"),
        ("POST", "/leases/counter", b"{", 400, "invalid_request", "must be JSON"),
        ("POST", "/leases/nosuch", {"parts": 1}, 404, "lambda_not_found", "nosuch"),
        ("POST", "/leases/webapp", {"parts": 1}, 400, "not_a_function", "web app"),
        ("POST", "/leases/0123/0", {}, 404, "lease_not_found", "0123"),
        ("POST", "/leases/0123/keepalive", None, 404, "lease_not_found", "0123"),
        ("DELETE", "/leases/0123", None, 404, "lease_not_found", "0123"),
    ]
    for method, path, body, status, code, words in checks:
        got_status, got = raw(w, method, path, body)
        assert (got_status, got["error"]) == (status, code), (method, path, body, got)
        assert words in got["message"], got
    status, body = raw(w, "POST", "/leases/counter", {"parts": 1}, token=False)
    assert (status, body["error"]) == (403, "forbidden") and leases(w) == []
    status, body = raw(w, "GET", "/leases", token=False)
    assert status == 403
    lease = sprout.Lease("counter", 1, client=w.client)
    try:
        for part, words in (("1", "parts 0 to 0"), ("x", "a number or keepalive")):
            status, body = raw(w, "POST", f"/leases/{lease.id}/{part}", {})
            assert (status, body["error"]) == (400, "invalid_request") and words in body["message"]
        with pytest.raises(IndexError):
            lease.call(1, {})
        status, body = raw(w, "POST", f"/leases/{lease.id}/keepalive")
        assert status == 200 and body == {"lease": lease.id}
    finally:
        lease.release()
    with pytest.raises(ValueError):
        sprout.Lease("counter", 0, client=w.client)
    with pytest.raises(ValueError):
        sprout.Lease("counter", 1, client=w.client, idle_timeout=0)
    with pytest.raises(sprout.SproutError) as e:
        sprout.Lease("counter", 4, client=w.client)
    assert e.value.code == "invalid_request"


def test_deleting_or_replacing_the_lambda_releases_its_leases(w):
    w.client.upload("doomed", targz({"f.py": COUNTER}))
    lease = sprout.Lease("doomed", 2, client=w.client)
    other = sprout.Lease("counter", 1, client=w.client)
    try:
        lease.call(0, {"add": 1})
        w.client.upload("doomed", targz({"f.py": COUNTER + "\n# v2\n"}))
        assert [x["lease"] for x in leases(w)] == [other.id]
        with pytest.raises(sprout.SproutError) as e:
            lease.call(0)
        assert e.value.code == "lease_not_found"
        lease = sprout.Lease("doomed", 1, client=w.client)
        w.client.delete("doomed")
        assert [x["lease"] for x in leases(w)] == [other.id]
        wait_for(lambda: sandboxes(w, "doomed") == 0, what="the deleted lambda's leased sandboxes gone")
        assert other.call(0, {"add": 2})["count"] == 2
    finally:
        lease.release()
        other.release()


def test_a_function_is_shipped_and_leased(w, tmp_path, monkeypatch):
    (tmp_path / "tally_mod.py").write_text("seen = []\n\ndef tally(event):\n    seen.append(event)\n    return len(seen)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("tally_mod")
    with sprout.Lease(module.tally, 1, client=w.client) as lease:
        assert lease.lambda_name.startswith("fn-tally-")
        assert [lease.call(0, i) for i in range(3)] == [1, 2, 3]
