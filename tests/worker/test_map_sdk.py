"""`sprout.map` (python/sprout/offload.py), docs/offload.md's client part.

The pure parts (batching, ordering, retries against a fake server, the channel inside a
sandbox) without a worker, then maps over a real worker's `POST /map/<name>`, from outside
and from inside a lambda. Shipping functions as lambdas (sprout.ship) is
test_map_sdk_ship.py's."""

import http.server
import itertools
import json
import pickle
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import sprout
from conftest import Worker, free_port, offline
from sprout import offload

# ---------------------------------------------------------------- batching and ordering


def test_a_sized_map_is_cut_into_about_four_requests_per_one_in_flight():
    # As `sprout map` cuts them (crates/cli/src/map.rs request_items): a fleet's HAProxy
    # hands /map/ requests to its workers in turn, so a small map still reaches them all.
    assert offload.request_size(1000, 4) == offload.MIN_ITEMS  # 16 requests, not 1
    assert offload.request_size(10_000, 4) == 625
    assert offload.request_size(10, 4) == offload.MIN_ITEMS  # one request: its cost is its own
    assert offload.request_size(10**6, 4) == offload.MAX_ITEMS
    assert offload.request_size(None, 4) == offload.MAX_ITEMS  # a generator: not known ahead


def test_batches_are_bounded_by_items_and_bytes():
    got = list(offload.batches(iter(range(5000))))
    assert [(start, len(batch)) for start, batch in got] == [(0, 2048), (2048, 2048), (4096, 904)]
    assert got[1][1][0] == "2048"
    # By bytes: each item is 102 bytes of JSON ("x" * 100 quoted), 1 more for its comma.
    items = ["x" * 100] * 50
    sizes = [len(offload.body_of(batch)) for _, batch in offload.batches(iter(items), max_bytes=1000)]
    assert all(size <= 1000 for size in sizes) and sum(len(b) for _, b in offload.batches(iter(items), max_bytes=1000)) == 50
    assert sizes[0] == 2 + 9 * 102 + 8
    # An item larger than the bound goes alone, between the others.
    mixed = ["a", "b" * 2000, "c"]
    assert [(s, b) for s, b in offload.batches(iter(mixed), max_bytes=1000)] == [(0, ['"a"']), (1, [json.dumps("b" * 2000)]), (2, ['"c"'])]
    assert list(offload.batches(iter([]))) == []


def test_batches_read_items_only_as_needed():
    produced = []

    def items():
        for i in itertools.count():
            produced.append(i)
            yield i

    batches = offload.batches(items(), max_items=10)
    assert next(batches) == (0, [str(i) for i in range(10)])
    assert len(produced) == 11  # the eleventh told the first batch was full
    next(batches)
    assert len(produced) == 21


def test_an_item_json_cannot_carry_is_refused_with_its_index():
    with pytest.raises(TypeError, match="item 2 cannot be sent as JSON"):
        list(offload.batches(iter([1, 2, {1, 2}])))
    with pytest.raises(TypeError, match="item 1 cannot be sent as JSON"):
        list(offload.batches(iter([1.0, float("nan")])))


def fake_send(delays=None, calls=None):
    """A sender answering each item x with {"result": x * 2} (an item {"fail": i}: an error),
    after delays[first item] seconds."""

    def send(batch):
        items = [json.loads(i) for i in batch]
        if calls is not None:
            calls.append(items)
        time.sleep((delays or {}).get(json.dumps(items[0]), 0))
        return [{"error": "handler_exception", "message": f"ValueError: {x['fail']}", "traceback": "Traceback..."}
                if isinstance(x, dict) else {"result": x * 2} for x in items]

    return send


def test_results_keep_the_items_order_when_later_requests_finish_first():
    batches = offload.batches(iter(range(100)), max_items=10)
    # The first request is the slowest: the others wait for it, in order.
    got = list(offload.in_flight(fake_send({"0": 0.3}), batches, 4, ordered=True))
    assert [start for start, _ in got] == list(range(0, 100, 10))
    assert [o["result"] for _, outcomes in got for o in outcomes] == [2 * i for i in range(100)]


def test_unordered_results_come_as_requests_finish():
    batches = offload.batches(iter(range(40)), max_items=10)
    got = list(offload.in_flight(fake_send({"0": 0.5}), batches, 4, ordered=False))
    assert sorted(start for start, _ in got) == [0, 10, 20, 30]
    assert got[-1][0] == 0  # the slow first request came last


def test_requests_in_flight_are_bounded_and_items_read_lazily():
    produced, calls, running, most = [], [], [0], [0]
    lock = threading.Lock()
    send = fake_send(calls=calls)

    def counting(batch):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01)
        try:
            return send(batch)
        finally:
            with lock:
                running[0] -= 1

    def items():
        for i in range(1_000_000):
            produced.append(i)
            yield i

    results = offload._results(counting, offload.batches(items(), max_items=100), 3, True, False)
    assert [next(results) for _ in range(5)] == [0, 2, 4, 6, 8]
    # At most 2 x concurrency requests made or held, and the next one's first item read.
    assert len(produced) <= (2 * 3 + 1) * 100 + 1
    rest = list(itertools.islice(results, 3000))
    assert rest == [2 * i for i in range(5, 3005)]
    assert most[0] <= 3
    results.close()
    assert len(produced) < 5000


def test_a_failed_item_raises_at_its_turn_or_is_returned():
    items = [0, 1, {"fail": 2}, 3]
    results = offload._results(fake_send(), offload.batches(iter(items)), 2, True, False)
    assert next(results) == 0 and next(results) == 2
    with pytest.raises(sprout.TaskError) as err:
        next(results)
    e = err.value
    assert (e.index, e.code, e.message, e.traceback, e.status) == (2, "handler_exception", "ValueError: 2", "Traceback...", 500)
    assert isinstance(e, sprout.SproutError) and str(e) == "item 2: handler_exception: ValueError: 2"
    returned = list(offload._results(fake_send(), offload.batches(iter(items)), 2, True, True))
    assert returned[:2] == [0, 2] and returned[3] == 6 and isinstance(returned[2], sprout.TaskError) and returned[2].index == 2
    again = pickle.loads(pickle.dumps(e))
    assert (again.index, again.code, again.message, again.traceback) == (2, "handler_exception", "ValueError: 2", "Traceback...")


def test_a_failed_request_raises_after_the_results_before_it():
    def send(batch):
        if batch[0] == "20":
            raise sprout.SproutError(413, "payload_too_large", "too big")
        return [{"result": int(i)} for i in batch]

    results = offload._results(send, offload.batches(iter(range(40)), max_items=10), 2, True, False)
    assert list(itertools.islice(results, 20)) == list(range(20))
    with pytest.raises(sprout.SproutError, match="payload_too_large"):
        next(results)


def test_arguments_are_checked_at_the_call():
    with pytest.raises(ValueError, match="concurrency"):
        sprout.map("echo", [], concurrency=0, client="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="retries"):
        sprout.map("echo", [], retries=-1, client="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="chunk"):
        sprout.map("echo", [], chunk=2000, client="http://127.0.0.1:1")
    with pytest.raises(TypeError, match="lambda's name or a function"):
        sprout.map(42, [], client="http://127.0.0.1:1")
    with pytest.raises(TypeError, match="client"):
        sprout.map("echo", [], client=42)
    with pytest.raises(TypeError, match="lambda expression"):
        sprout.map(lambda x: x, [], client="http://127.0.0.1:1")


# ---------------------------------------------------------------- HTTP: a fake worker


class FakeWorker:
    """A tiny HTTP/1.1 server standing for a worker (or a proxy before one): answers `POST
    /map/...` with the first `fail` requests answered `status`, then by forwarding to
    `upstream` (a real worker's URL) or with {"result": item * 2} for each item. Counts
    requests and connections."""

    def __init__(self, upstream=None, fail=0, status=503, retry_after=None):
        self.upstream, self.fail, self.status, self.retry_after = upstream, fail, status, retry_after
        self.requests, self.connections, self.paths, self.sizes = 0, 0, [], []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                fake.connections += 1

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                fake.requests += 1
                fake.paths.append(self.path)
                fake.sizes.append(len(body))
                if fake.fail > 0:
                    fake.fail -= 1
                    reply = json.dumps({"error": "shutting_down", "message": "busy"}).encode()
                    self.answer(fake.status, reply, {"Retry-After": fake.retry_after} if fake.retry_after else {})
                    return
                if fake.upstream:
                    import urllib.error
                    import urllib.request

                    request = urllib.request.Request(fake.upstream + self.path, data=body, method="POST",
                                                     headers={"Content-Type": "application/json"})
                    try:
                        with urllib.request.urlopen(request, timeout=60) as r:
                            status, reply = r.status, r.read()
                    except urllib.error.HTTPError as e:
                        status, reply = e.code, e.read()
                    self.answer(status, reply)
                    return
                items = json.loads(body)
                self.answer(200, json.dumps([{"result": x * 2} for x in items]).encode())

            def answer(self, status, reply, headers=None):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(reply)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    servers = []

    def make(**kwargs):
        servers.append(FakeWorker(**kwargs))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


@pytest.fixture
def quick_backoff(monkeypatch):
    monkeypatch.setattr(offload, "BACKOFF", 0.01)


def test_requests_reuse_keep_alive_connections(fake, monkeypatch):
    server = fake()
    monkeypatch.setattr(offload, "MAX_ITEMS", 10)
    client = sprout.Client(server.url)
    assert list(sprout.map("double", range(100), concurrency=1, client=client)) == [2 * i for i in range(100)]
    assert (server.requests, server.connections) == (10, 1)
    # Later maps of the same client reuse its connections; at most `concurrency` are opened.
    assert sorted(sprout.map("double", range(200), concurrency=3, ordered=False, client=client)) == [2 * i for i in range(200)]
    assert server.requests == 30 and server.connections <= 3
    assert server.paths[0] == "/map/double"
    assert list(client.map("double", [1], chunk=1)) == [2]
    assert server.paths[-1] == "/map/double?chunk=1"
    client.close()


def test_a_503_is_sent_again_then_given_up(fake, quick_backoff):
    server = fake(fail=2)
    assert list(sprout.map("double", [1, 2], client=server.url)) == [2, 4]
    assert server.requests == 3
    server = fake(fail=3, status=502)
    with pytest.raises(sprout.SproutError) as err:
        list(sprout.map("double", [1, 2], client=server.url))
    assert err.value.status == 502 and server.requests == 3
    server = fake(fail=1, status=429, retry_after="0.05")
    assert list(sprout.map("double", [3], client=server.url, retries=1)) == [6]
    # Other errors are not sent again.
    server = fake(fail=1, status=404)
    with pytest.raises(sprout.SproutError) as err:
        list(sprout.map("double", [1], client=server.url))
    assert err.value.status == 404 and server.requests == 1


def test_a_refused_connection_is_tried_again_then_raised(quick_backoff, monkeypatch):
    tries = []
    real = sprout.Client._connect
    monkeypatch.setattr(sprout.Client, "_connect", lambda self: tries.append(1) or real(self))
    with pytest.raises(ConnectionRefusedError):
        list(sprout.map("double", [1], client=f"http://127.0.0.1:{free_port()}", retries=3))
    assert len(tries) == 4


INTERRUPTS = {
    "process": "os.kill(os.getpid(), signal.SIGINT)",
    # The kernel may hand a process's signal to any of its threads that does not block it.
    "request thread": "signal.pthread_kill(next(t.ident for t in threading.enumerate() if t.name == 'sprout-map-0'), signal.SIGINT)",
}


@pytest.mark.parametrize("to", INTERRUPTS)
def test_an_abandoned_map_does_not_hold_the_exit(tmp_path, to):
    """Requests under way when a map is given up (here Ctrl-C while a worker never answers)
    do not keep the process from exiting, whichever thread the signal is delivered to."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # connections are made, never answered
    script = textwrap.dedent(f"""
        import faulthandler
        faulthandler.dump_traceback_later(20, exit=True)  # where it hangs, if it does
        import os, signal, threading
        signal.signal(signal.SIGINT, signal.default_int_handler)  # were it ignored where the tests run
        import sprout, sprout.offload
        sprout.offload.MAX_ITEMS = 5
        threading.Timer(0.5, lambda: {INTERRUPTS[to]}).start()
        try:
            next(sprout.map("x", range(20), client="http://127.0.0.1:{silent.getsockname()[1]}"))
        except KeyboardInterrupt:
            print("interrupted")
    """)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(sprout.__path__[0] + "/.."), "PYTHONDONTWRITEBYTECODE": "1"}
    began = time.monotonic()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=30)
    silent.close()
    assert out.stdout == "interrupted\n", out.stderr[-4000:]
    assert time.monotonic() - began < 10


def test_map_goes_over_the_channel_inside_a_sandbox(monkeypatch, quick_backoff):
    calls = []

    class Channel:
        def call(self, name, body, batch=False):
            calls.append((name, json.loads(body), batch))
            if name == "busy" and len(calls) == 1:
                return {"error": "queue_full", "status": 429, "message": "full"}, b""
            if name == "nosuch":
                return {"error": "lambda_not_found", "status": 404, "message": "no lambda"}, b""
            return {}, json.dumps([{"result": x + 1} for x in json.loads(body)]).encode()

    monkeypatch.setitem(sys.modules, "_sprout_sandbox", Channel())
    monkeypatch.setattr(offload, "MAX_ITEMS", 3)
    assert list(sprout.map("inc", range(7), concurrency=8)) == list(range(1, 8))
    assert [(n, items, batch) for n, items, batch in calls] == [("inc", [0, 1, 2], True), ("inc", [3, 4, 5], True), ("inc", [6], True)]
    calls.clear()
    assert list(sprout.map("busy", [1])) == [2] and len(calls) == 2
    with pytest.raises(sprout.InvokeError) as err:
        list(sprout.map("nosuch", [1]))
    assert (err.value.status, err.value.code) == (404, "lambda_not_found")
    with pytest.raises(TypeError, match="cannot deploy"):
        sprout.map(test_map_goes_over_the_channel_inside_a_sandbox, [1])

# ---------------------------------------------------------------- against a real worker

SQUARE = '''
def f(event):
    if isinstance(event, dict) and "fail" in event:
        raise ValueError(f"bad item {event['fail']}")
    return event * event
'''

SLOW = '''
import time

def f(event):
    time.sleep(0.002)
    return event + 1
'''

NAP = '''
import time

def f(event):
    time.sleep(event["s"])
    return event["i"]
'''

WEB = '''
def app(environ, start_response):
    start_response("200 OK", [])
    return [b"hi"]
'''

# Maps from inside a lambda, over the sandbox's channel.
FANOUT = '''
import sprout

def local(x):
    return x

def f(event):
    out = {}
    try:
        out["results"] = list(sprout.map(event["name"], event["items"], return_exceptions=event.get("return_exceptions", False)))
        out["results"] = [{"code": r.code, "index": r.index} if isinstance(r, sprout.TaskError) else r for r in out["results"]]
    except sprout.TaskError as e:
        out["error"] = {"type": "TaskError", "index": e.index, "code": e.code, "message": e.message}
    except sprout.SproutError as e:
        out["error"] = {"type": type(e).__name__, "status": e.status, "code": e.code}
    try:
        sprout.map(local, [1])
    except TypeError as e:
        out["function"] = str(e)
    return out
'''


@pytest.fixture(scope="module")
def w(tmp_path_factory, sprout_bin, wheel_dir):
    worker = Worker(tmp_path_factory.mktemp("worker"), offline(wheel_dir))
    worker.start()
    for name, source in [("square", SQUARE), ("nap", NAP), ("web", WEB), ("fanout", FANOUT)]:
        worker.deploy_source(name, source)
    yield worker
    worker.stop()
    assert worker.leftovers() == []


def test_ordered_results_of_a_deployed_lambda(w):
    assert list(sprout.map("square", range(3000), client=w.client)) == [i * i for i in range(3000)]
    # A URL serves as well; no items, no results.
    assert list(sprout.map("square", [], client=w.url)) == []
    assert list(sprout.map("square", [7], client=w.url)) == [49]


def test_unordered_results_over_many_requests(w, monkeypatch):
    monkeypatch.setattr(offload, "MAX_ITEMS", 100)
    items = ({"i": i, "s": 1 if i == 0 else 0} for i in range(3000))  # the first request takes 1 s
    results = list(sprout.map("nap", items, ordered=False, concurrency=3, client=w.client))
    assert sorted(results) == list(range(3000))
    assert results.index(0) >= 100  # later requests' results came before the first's


def test_an_items_exception_is_a_task_error_at_its_index(w):
    items = [*range(1234), {"fail": "x"}, *range(1235, 3000)]
    results = sprout.map("square", items, client=w.client)
    got = []
    with pytest.raises(sprout.TaskError) as err:
        for r in results:
            got.append(r)
    assert got == [i * i for i in range(1234)]
    e = err.value
    assert (e.index, e.code) == (1234, "handler_exception")
    assert "ValueError: bad item x" in e.message and "ValueError: bad item x" in e.traceback
    returned = list(sprout.map("square", items, return_exceptions=True, client=w.client))
    assert isinstance(returned[1234], sprout.TaskError) and returned[1234].index == 1234
    assert returned[:1234] == [i * i for i in range(1234)] and returned[1235:] == [i * i for i in range(1235, 3000)]


def test_a_request_that_fails_as_a_whole_raises_at_once(w, fake):
    proxy = fake(upstream=w.url)
    with pytest.raises(sprout.SproutError) as err:
        list(sprout.map("nosuch", [1, 2], client=proxy.url))
    assert (err.value.status, err.value.code, proxy.requests) == (404, "lambda_not_found", 1)
    with pytest.raises(sprout.SproutError) as err:
        list(sprout.map("web", [1], client=proxy.url))
    assert (err.value.status, err.value.code, proxy.requests) == (400, "not_a_function", 2)
    # (An item over the worker's body limit goes through its blob store: test_map_blobs.py.)


def test_a_503_before_the_worker_is_sent_again(w, fake, quick_backoff):
    proxy = fake(upstream=w.url, fail=2)
    assert list(sprout.map("square", range(10), client=proxy.url)) == [i * i for i in range(10)]
    assert proxy.requests == 3


def test_a_generator_of_items_is_read_lazily(w):
    produced = []

    def items():
        for i in range(1_000_000):
            produced.append(i)
            yield i

    results = sprout.map("square", items(), concurrency=2, client=w.client)
    assert produced == []  # nothing read before the first result is asked for
    assert [next(results) for _ in range(3)] == [0, 1, 4]
    assert len(produced) <= (2 * 2 + 1) * offload.MAX_ITEMS + 1
    results.close()


def test_map_from_inside_a_lambda(w):
    out = w.client.run("fanout", {"name": "square", "items": list(range(3000))})
    assert out["results"] == [i * i for i in range(3000)]
    assert "cannot deploy" in out["function"]
    failed = w.client.run("fanout", {"name": "square", "items": [1, {"fail": 1}, 3]})
    assert failed["error"] == {"type": "TaskError", "index": 1, "code": "handler_exception", "message": "ValueError: bad item 1"}
    returned = w.client.run("fanout", {"name": "square", "items": [1, {"fail": 1}, 3], "return_exceptions": True})
    assert returned["results"] == [1, {"code": "handler_exception", "index": 1}, 9]
    missing = w.client.run("fanout", {"name": "nosuch", "items": [1]})
    assert missing["error"] == {"type": "InvokeError", "status": 404, "code": "lambda_not_found"}


def test_a_map_survives_its_worker_restarting(make_worker, monkeypatch):
    worker = make_worker()
    worker.deploy_source("slow", SLOW)
    monkeypatch.setattr(offload, "MAX_ITEMS", 100)
    monkeypatch.setattr(offload, "BACKOFF", 0.5)
    client = sprout.Client(worker.url)
    undelivered = []
    real = client._keep_alive_call

    def call(*args, **kwargs):
        try:
            reply = real(*args, **kwargs)
        except OSError as e:
            undelivered.append(type(e).__name__)
            raise
        if reply.status != 200:
            undelivered.append(reply.status)
        return reply

    monkeypatch.setattr(client, "_keep_alive_call", call)
    results = sprout.map("slow", range(8000), concurrency=2, retries=8, client=client)
    got = [next(results)]

    def restart():
        worker.stop()
        worker.start()

    restarter = threading.Thread(target=restart)
    restarter.start()
    got += list(results)
    restarter.join()
    assert got == list(range(1, 8001))
    assert undelivered, "the map finished before the worker stopped"
