"""Requests whose sandbox dies before answering, against a real worker: a safe request (GET,
HEAD, OPTIONS to a WSGI app) runs once more on another sandbox and answers; nothing else ever
runs twice — f(event) invocations, unsafe methods, a reply that had begun, a handler past its
time or memory limit. The lambdas write a journal line on a shared volume for every request
they begin, so the tests count executions even of requests whose sandbox died."""

import concurrent.futures
import os
import signal
import threading
import time

import pytest

import sprout

VOLUME = "/srv/sprout-test-rw"  # the mount point test_volumes uses too (made once in the base image)
SANDBOX_UID = 65534
TIME_LIMIT_MS = 4000
SAFE, UNSAFE = ["GET", "HEAD", "OPTIONS"], ["POST", "PUT", "DELETE"]


class Site:
    """A worker serving the recorder app and the recorder_fn function, with their journal."""

    def __init__(self, worker, journal):
        self.worker, self.client, self.journal = worker, worker.client, journal

    def runs(self, tag):
        """Journal lines (method, path, query, sandbox) of requests tagged `tag`."""
        if not self.journal.exists():
            return []
        lines = [line.split(" ") for line in self.journal.read_text().splitlines()]
        return [tuple(fields) for fields in lines if f"tag={tag}" in fields[2].split("&")]

    def wait_for_run(self, tag, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.runs(tag):
                return
            time.sleep(0.01)
        pytest.fail(f"request {tag} never began:\n{self.worker.log()[-3000:]}")

    def get(self, path, method="GET"):
        """(status, error code or None, body) of a request to the recorder app."""
        try:
            reply = self.client.request(method, "recorder", path)
        except sprout.SproutError as err:
            return err.status, err.code, b""
        return reply.status, None, reply.body

    def call(self, name, event):
        """(status, error code or None, result) of an f(event) invocation."""
        try:
            return 200, None, self.client.run(name, event)
        except sprout.SproutError as err:
            return err.status, err.code, None

    def sandbox_pids(self):
        """Host pids in the worker's sandbox cgroups (not the Zygotes')."""
        root = f"/sys/fs/cgroup/pids/{self.worker.cgroup_names[0]}"
        pids = []
        for group in os.listdir(root):
            if group.startswith("sb-"):
                pids += [int(p) for p in open(f"{root}/{group}/cgroup.procs").read().split()]
        return pids

    def kill_sandboxes(self):
        victims = self.sandbox_pids()
        assert victims, "no sandbox to kill"
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        return victims

    def wait_paused(self, n):
        deadline = time.time() + 30
        while self.client.stats()["handler_cache"]["paused"] < n:
            assert time.time() < deadline, self.client.stats()["handler_cache"]
            time.sleep(0.02)

    def retries(self):
        return self.client.stats()["retries"]


@pytest.fixture
def site(make_worker, tmp_path):
    shared = tmp_path / "journal"
    shared.mkdir()
    os.chown(shared, SANDBOX_UID, SANDBOX_UID)
    w = make_worker(
        sandbox={"volumes": [{"host": str(shared), "path": VOLUME, "writable": True}]},
        limits={"timeout_ms": TIME_LIMIT_MS, "memory_mb": 64},
        handler_cache={"pause_after_ms": 20},
    )
    w.deploy_test_lambda("recorder")
    w.deploy_test_lambda("recorder_fn")
    return Site(w, shared / "journal.log")


def in_background(call):
    """Run `call` in a thread; returns a function that waits for its result."""
    result = {}
    thread = threading.Thread(target=lambda: result.update(value=call()), daemon=True)
    thread.start()

    def wait():
        thread.join(60)
        assert "value" in result, "the request never returned"
        return result["value"]

    return wait


@pytest.mark.parametrize("handler", ["wsgi", "function"])
def test_requests_right_after_paused_sandboxes_are_killed_all_answer(site, handler):
    if handler == "wsgi":
        send = lambda tag, nap=0: site.get(f"/nap?tag={tag}&s={nap}")  # noqa: E731
    else:
        send = lambda tag, nap=0: site.call("recorder_fn", {"tag": tag, "nap": nap})  # noqa: E731
    with concurrent.futures.ThreadPoolExecutor(3) as pool:  # three requests at once: three sandboxes
        assert [r[0] for r in pool.map(lambda i: send(f"warm{i}", 0.5), range(3))] == [200] * 3
    site.wait_paused(3)
    victims = site.kill_sandboxes()
    # Frozen, they cannot die yet: each SIGKILL waits for the thaw a request would bring.
    assert len(victims) == 3 and all(os.path.exists(f"/proc/{pid}") for pid in victims)
    replies = [send(i) for i in range(10)]
    assert [status for status, _, _ in replies] == [200] * 10, replies
    for i in range(10):
        assert len(site.runs(i)) == 1, site.runs(i)  # the dead sandboxes ran nothing
    stats = site.client.stats()
    assert "sandbox_crashed" not in stats["errors"]
    # Seen as killed before a request was sent to it: nothing needed a second sandbox.
    assert stats["handler_cache"]["evictions"]["dead"] >= 1
    assert stats["retries"] == {"no_reply": 0, "send_failed": 0}


def test_a_get_whose_sandbox_is_killed_mid_request_runs_again_elsewhere(site):
    assert site.get("/ok?tag=warm")[0] == 200
    reply = in_background(lambda: site.get("/nap?tag=killed&s=1"))
    site.wait_for_run("killed")
    assert len(site.kill_sandboxes()) == 1
    status, code, body = reply()
    assert (status, code) == (200, None)
    runs = site.runs("killed")
    assert len(runs) == 2 and runs[0][3] != runs[1][3], runs  # on two sandboxes
    assert body.decode() == runs[1][3]
    assert site.retries() == {"no_reply": 1, "send_failed": 0}
    assert 'sprout_retries_total{reason="no_reply"} 1' in site.client.metrics()


@pytest.mark.parametrize("handler", ["function", "wsgi"])
def test_a_post_whose_sandbox_is_killed_mid_request_is_not_run_again(site, handler):
    if handler == "function":
        reply = in_background(lambda: site.call("recorder_fn", {"tag": "killed", "nap": 1}))
    else:
        reply = in_background(lambda: site.get("/nap?tag=killed&s=1", method="POST"))
    site.wait_for_run("killed")
    site.kill_sandboxes()
    assert reply()[:2] == (502, "sandbox_crashed")
    assert len(site.runs("killed")) == 1
    assert site.retries() == {"no_reply": 0, "send_failed": 0}


@pytest.mark.parametrize("method", SAFE + UNSAFE)
def test_a_handler_that_ends_its_sandbox_is_retried_once_only_when_safe(site, method):
    status, code, _ = site.get(f"/crash?tag={method}", method=method)
    assert status == 502 and code in ("sandbox_crashed", None)  # a reply to HEAD has no body
    runs = site.runs(method)
    assert len(runs) == (2 if method in SAFE else 1), runs
    assert len({run[3] for run in runs}) == len(runs)  # each run on a sandbox of its own
    assert site.retries()["no_reply"] == (1 if method in SAFE else 0)
    assert site.get("/ok?tag=after")[0] == 200


def test_a_reply_that_had_begun_is_never_retried(site):
    assert site.get("/half?tag=half") == (502, "sandbox_crashed", b"")
    assert len(site.runs("half")) == 1
    assert site.retries() == {"no_reply": 0, "send_failed": 0}


def test_time_and_memory_limits_are_never_retried(site):
    assert site.get("/sleep?tag=slow")[:2] == (504, "timeout")
    assert site.get("/hog?tag=hog")[:2] == (502, "out_of_memory")
    assert len(site.runs("slow")) == 1 and len(site.runs("hog")) == 1
    assert site.retries() == {"no_reply": 0, "send_failed": 0}


def test_a_retry_gets_only_what_is_left_of_the_time_limit(site):
    # 3.8 s of work, its sandbox killed after 3 s: with a fresh limit of 4 s the retry would
    # finish; with the 1 s left of the request's own it cannot.
    reply = in_background(lambda: site.get("/nap?tag=late&s=3.8"))
    site.wait_for_run("late")
    time.sleep(3)
    site.kill_sandboxes()
    status, code, _ = reply()
    assert (status, code) == (504, "timeout")
    assert len(site.runs("late")) == 2
    assert site.retries()["no_reply"] == 1

