"""`sprout.map` (python/sprout/offload.py) and the shipping of functions as lambdas
(python/sprout/ship.py), docs/offload.md's client part: the pure parts (batching, ordering,
retries against a fake server, module discovery) without a worker, then maps over a real
worker's `POST /map/<name>`, from outside and from inside a lambda."""

import hashlib
import http.server
import itertools
import json
import pickle
import subprocess
import sys
import textwrap
import threading
import time
import zipfile

import pytest

import sprout
from conftest import Worker, free_port, offline
from sprout import offload, ship

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


# ---------------------------------------------------------------- shipping, without a worker


def write_project(root, files):
    for path, source in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(source))


PROJECT = {
    "scoring.py": """
        import json
        import os.path

        import helpers
        from pkg import sub

        def score(x):
            import pkg.lazy  # an import inside a function counts too
            return helpers.double(x) + sub.ONE + pkg.lazy.ZERO

        async def ascore(x):
            return x + 100

        class Scorer:
            @staticmethod
            def triple(x):
                return 3 * x

            def plain(self, x):
                return x

        if __name__ == "__main__":
            import unused_here
    """,
    # tabnanny: a project's module named like one of the standard library's is the project's.
    "helpers.py": "import importlib\nimport tabnanny\nBASE = importlib.import_module('consts').BASE + tabnanny.ZERO\n\n"
                  "def double(x):\n    return 2 * x + BASE\n",
    "tabnanny.py": "ZERO = 0\n",
    "consts.py": "BASE = 0\n",
    "pkg/__init__.py": "from .sub import ONE\n",
    "pkg/sub.py": "from . import deep\nONE = 1\n",
    "pkg/deep.py": "",
    "pkg/lazy.py": "ZERO = 0\n",
    "unrelated.py": "raise RuntimeError('never imported')\n",
}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A small project on sys.path: returns its directory and a function importing its
    modules (forgotten afterwards). What was shipped before is forgotten too."""
    monkeypatch.setattr(ship, "_deployed", set())
    monkeypatch.setattr(ship, "_packed", ship.weakref.WeakKeyDictionary())
    root = tmp_path / "proj"
    write_project(root, PROJECT)
    monkeypatch.syspath_prepend(str(root))
    loaded = []

    def load(name):
        import importlib

        loaded.append(name)
        return importlib.import_module(name)

    yield root, load
    ours = {"scoring", "helpers", "consts", "pkg", "unrelated", "ffunc", "f", "uses_gamma", "tabnanny", *loaded}
    for name in list(sys.modules):
        if name.split(".")[0] in ours:
            del sys.modules[name]


def test_imports_are_read_with_ast():
    import ast

    tree = ast.parse(textwrap.dedent("""
        import a.b, c as d
        from e import f, g
        from . import h
        from ..i import j
        from .k import *
        import importlib
        importlib.import_module("l.m")
        __import__("n")
        def inner():
            import o
    """))
    assert ship.imports_of(tree, "top.pkg.mod", False) == ["a.b", "c", "e", "e.f", "e.g", "top.pkg", "top.pkg.h", "top.i", "top.i.j",
                                                         "top.pkg.k", "importlib", "l.m", "n", "o"]
    assert ship.imports_of(ast.parse("from . import x"), "top", True) == ["top", "top.x"]
    assert ship.imports_of(ast.parse("from .. import x"), "script", False) == []


def test_a_function_ships_with_the_project_modules_it_imports(project):
    root, load = project
    scoring = load("scoring")
    packed = ship.package(scoring.score)
    assert sorted(packed.files) == ["consts.py", "f.py", "helpers.py", "pkg/__init__.py", "pkg/deep.py", "pkg/lazy.py", "pkg/sub.py",
                                    "scoring.py", "tabnanny.py"]
    assert packed.files["helpers.py"] == (root / "helpers.py").read_bytes()
    assert "requirements.txt" not in packed.files  # json, os.path: the standard library
    assert packed.name.startswith("fn-score-") and len(packed.name) == len("fn-score-") + 12
    # The same files, the same name and archive; the archive holds exactly them.
    assert ship.package(scoring.score) == packed and ship.package(scoring.score).archive() == packed.archive()
    run_locally(packed, root.parent / "unpacked", [5, 6], [11, 13])


def run_locally(packed, directory, events, expected):
    """Unpack the lambda and call its f.py's f on each event in a fresh Python."""
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(packed.archive())) as archive:
        archive.extractall(directory, filter="data")
    entry = "_sprout_f" if (directory / "_sprout_f.py").exists() else "f"
    code = f"import json, {entry}; print(json.dumps([{entry}.f(e) for e in {events!r}]))"
    out = subprocess.run([sys.executable, "-c", code], cwd=directory, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == expected


def test_methods_async_functions_and_what_cannot_be_shipped(project, tmp_path):
    _, load = project
    scoring = load("scoring")
    run_locally(ship.package(scoring.Scorer.triple), tmp_path / "triple", [2], [6])
    run_locally(ship.package(scoring.ascore), tmp_path / "async", [1], [101])
    with pytest.raises(TypeError, match="lambda expression"):
        ship.package(lambda x: x)

    def nested(x):
        return x

    with pytest.raises(TypeError, match="nested"):
        ship.package(nested)
    namespace = {"__name__": "made_by_exec"}
    exec("def g(x):\n    return x\n", namespace)
    with pytest.raises(TypeError, match="no source file"):
        ship.package(namespace["g"])
    with pytest.raises(TypeError, match="no source file"):
        ship.package(len)
    with pytest.raises(TypeError, match="bound method"):
        ship.package(scoring.Scorer().plain)


def test_stdlib_and_installed_functions_ship_only_their_entry(tmp_path):
    import posixpath

    packed = ship.package(posixpath.basename)
    assert sorted(packed.files) == ["f.py"]
    run_locally(packed, tmp_path / "basename", ["/a/b"], ["b"])


def test_third_party_imports_are_pinned(project, tmp_path, monkeypatch, wheel_dir):
    root, load = project
    # gamma 1.0 "installed" in a site-packages directory (even one inside the project).
    site = root / "venv" / "site-packages"
    with zipfile.ZipFile(wheel_dir / "gamma-1.0-py3-none-any.whl") as wheel:
        wheel.extractall(site)
    monkeypatch.syspath_prepend(str(site))
    write_project(root, {"uses_gamma.py": "import gamma\nimport sprout\n\ndef g(x):\n    return [gamma.NAME, x]\n"})
    module = load("uses_gamma")
    packed = ship.package(module.g)
    assert sorted(packed.files) == ["f.py", "requirements.txt", "uses_gamma.py"]
    assert packed.files["requirements.txt"] == b"gamma==1.0\n"
    assert ship.package(module.g, requirements=["gamma==1.0", "beta==2.0"]).files["requirements.txt"] == b"gamma==1.0\nbeta==2.0\n"
    assert "requirements.txt" not in ship.package(module.g, requirements="").files
    sys.modules.pop("gamma", None)


def test_a_project_module_named_f_moves_the_entry(project):
    root, load = project
    write_project(root, {"f.py": "def helper(x):\n    return x - 1\n", "ffunc.py": "import f\n\ndef g(x):\n    return f.helper(x)\n"})
    packed = ship.package(load("ffunc").g)
    assert sorted(packed.files) == ["_sprout_f.py", "f.py", "ffunc.py", "ol.yaml"]
    assert packed.files["ol.yaml"] == b"environment:\n  OL_ENTRY_FILE: _sprout_f.py\n"
    run_locally(packed, root.parent / "unpacked", [10], [9])


def test_names_are_made_of_the_function_and_its_files():
    name = ship.lambda_name("größe_" + "x" * 100, {"f.py": b"1"})
    assert len(name) == 64 and name.startswith("fn-gr__e_xxx") and name.isascii()
    assert ship.lambda_name("a", {"f.py": b"1"}) != ship.lambda_name("a", {"f.py": b"2"})
    assert ship.lambda_name("a", {"f.py": b"1"}) != ship.lambda_name("a", {"g.py": b"1"})


def test_a_scripts_function_ships_without_its_main_block(tmp_path):
    root = tmp_path / "app"
    write_project(root, {
        "job.py": """
            import helpers

            def work(x):
                return helpers.add_one(x)

            if __name__ == "__main__":
                import sprout.ship

                def only_here(x):
                    return x
                packed = sprout.ship.package(work)
                try:
                    sprout.ship.package(only_here)
                except TypeError as e:
                    refused = str(e)
                import json
                print(json.dumps({"files": {k: v.decode() for k, v in packed.files.items()}, "refused": refused}))
        """,
        "helpers.py": "def add_one(x):\n    return x + 1\n",
    })
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(sprout.__path__[0] + "/.."), "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([sys.executable, str(root / "job.py")], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    files = result["files"]
    assert sorted(files) == ["f.py", "helpers.py", "job.py"]
    assert "from job import work" in files["f.py"]
    assert "under `if __name__" in result["refused"]
    # Imported as `job`, its main block does not run.
    packed = ship.Package("x", {k: v.encode() for k, v in files.items()})
    run_locally(packed, tmp_path / "unpacked", [1], [2])


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


def test_a_function_is_shipped_with_its_helper_and_deployed_once(w, project, monkeypatch):
    root, load = project
    scoring = load("scoring")
    client = sprout.Client(w.url, timeout=60)
    calls = []
    for method in ("get", "upload"):
        real = getattr(client, method)
        monkeypatch.setattr(client, method, lambda *a, _m=method, _r=real: calls.append(_m) or _r(*a))
    assert list(sprout.map(scoring.score, range(50), client=client)) == [2 * i + 1 for i in range(50)]
    packed = ship.package(scoring.score)
    meta = w.client.get(packed.name)
    assert meta["files"] == len(packed.files) == 9
    assert meta["sha256"] == hashlib.sha256(packed.archive()).hexdigest()
    assert calls == ["get", "upload"]
    # Again: packed and deployed already in this process.
    assert list(sprout.map(scoring.score, [3], client=client)) == [7]
    assert calls == ["get", "upload"]
    # Another process (the memo forgotten) finds it on the worker and does not upload it.
    monkeypatch.setattr(ship, "_deployed", set())
    monkeypatch.setattr(ship, "_packed", ship.weakref.WeakKeyDictionary())
    assert list(sprout.map(scoring.score, [4], client=client)) == [9]
    assert calls == ["get", "upload", "get"] and w.client.get(packed.name)["version"] == meta["version"]


def test_a_shipped_function_gets_its_pinned_packages(w, project, monkeypatch, wheel_dir):
    root, load = project
    site = root / "site-packages"
    with zipfile.ZipFile(wheel_dir / "gamma-1.0-py3-none-any.whl") as wheel:
        wheel.extractall(site)
    monkeypatch.syspath_prepend(str(site))
    write_project(root, {"uses_gamma.py": "import gamma\n\ndef g(x):\n    return [gamma.NAME, x]\n"})
    module = load("uses_gamma")
    assert list(sprout.map(module.g, ["a", "b"], client=w.client)) == [["gamma", "a"], ["gamma", "b"]]
    assert w.client.get(ship.package(module.g).name)["requirements"] == ["gamma==1.0"]
    sys.modules.pop("gamma", None)


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
