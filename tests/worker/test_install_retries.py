"""The installer tries a package index again when it fails for a moment, a bounded number of
times, and a failed install says why in pip's own words (the lines that explain, not only the
last): against a real index served here over HTTP, which lists nothing for its first answers."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import sprout
from conftest import Worker, deploy_with, free_port, make_wheel, module

SOURCE = "import flaky\n\ndef f(event):\n    return flaky.NAME\n"


class FlakyIndex:
    """A PEP 503 simple index of one package, `flaky`, that answers 404 (no such project,
    which pip reads as "from versions: none") to its first `failures` listings."""

    def __init__(self, wheels, failures):
        self.wheels = wheels
        self.failures = failures
        self.listings = 0
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path.rstrip("/") == "/simple/flaky":
                    index.listings += 1
                    if index.listings <= index.failures:
                        return self.answer(404, b"not found")
                    links = "".join(f'<a href="/files/{w.name}">{w.name}</a>' for w in index.wheels.glob("flaky-*.whl"))
                    return self.answer(200, f"<html><body>{links}</body></html>".encode(), "text/html")
                if self.path.startswith("/files/"):
                    wheel = index.wheels / self.path.removeprefix("/files/")
                    if wheel.is_file():
                        return self.answer(200, wheel.read_bytes(), "application/octet-stream")
                self.answer(404, b"not found")

            def answer(self, status, body, kind="text/plain"):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/simple"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def index_worker(tmp_path, sprout_bin):
    """A worker installing from a flaky index; its `failures` set by the test."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "flaky", "1.0", module("flaky"))
    index = FlakyIndex(wheels, failures=0)
    worker = Worker(tmp_path / "w", {"packages": {"index_url": index.url}})
    worker.start()
    yield worker, index
    worker.stop()
    index.close()
    assert worker.leftovers() == []


def test_an_index_that_lists_nothing_once_is_tried_again(index_worker):
    worker, index = index_worker
    index.failures = 1
    deploy_with(worker, "flaky-user", SOURCE, "flaky==1.0\n")
    assert worker.client.run("flaky-user") == "flaky"
    # the resolution's listing failed, its second try's did not, and the install's neither
    assert index.listings == 3
    assert "the index's failure for a moment; trying again" in worker.log()


def test_an_index_that_keeps_failing_gives_up_after_three_tries_saying_why(index_worker):
    worker, index = index_worker
    index.failures = 1000
    deploy_with(worker, "flaky-user", SOURCE, "flaky==1.0\n")
    with pytest.raises(sprout.SproutError) as err:
        worker.client.run("flaky-user")
    e = err.value
    assert (e.status, e.code) == (500, "install_failed")
    assert index.listings == 3, "bounded: three tries in all"
    assert "tried 3 times" in e.message
    # pip's reasons, both lines, in the message and on their own; not only its last line
    assert "from versions: none" in e.message and "No matching distribution found for flaky==1.0" in e.message
    reasons = e.body["pip_reasons"]
    assert any("Could not find a version that satisfies the requirement flaky==1.0" in r for r in reasons), reasons
    assert any("No matching distribution found" in r for r in reasons), reasons
