"""Large items and results of `sprout.map` through the worker's blob store
(crates/worker/src/blobs.rs, python/sprout/offload.py, the helper's invoke_batch): items and
results of 20 MB with the default body and frame limits (6 and 16 MB), from a client and from
inside a lambda; the blob routes' checks; blobs that cannot be read; nothing left behind."""

import json
import os
import urllib.error

import pytest

import sprout
from conftest import Worker, api_request

MB20 = 20 << 20

SIZES = '''
def f(event):
    if event.get("make"):
        return "y" * event["make"]     # a result of that many bytes
    return len(event["data"])
'''

FANOUT = '''
import sprout

def f(event):
    results = list(sprout.map("sizes", event["items"]))
    return [len(r) if isinstance(r, str) else r for r in results]
'''


@pytest.fixture(scope="module")
def w(tmp_path_factory, sprout_bin):
    worker = Worker(tmp_path_factory.mktemp("worker"), {})
    worker.start()
    worker.deploy_source("sizes", SIZES)
    worker.deploy_source("fanout", FANOUT)
    yield worker
    worker.stop()
    assert worker.leftovers() == []
    assert not (worker.dir / "blobs").exists(), "the worker's blobs go when it stops"


def blobs(worker):
    return sorted(os.listdir(worker.dir / "blobs"))


def test_items_and_results_of_20_mb_pass_through_the_blob_store(w):
    items = [{"data": "x" * MB20}, {"data": "small"}, {"make": MB20}, {"make": 3}]
    results = list(sprout.map("sizes", items, client=w.client))
    assert results[:2] == [MB20, 5]
    assert len(results[2]) == MB20 and results[2] == "y" * MB20
    assert results[3] == "yyy"
    assert blobs(w) == [], "the items' and results' blobs are deleted once read"
    # The same without the blob store would not fit: a 20 MB body is refused (413, or the
    # connection closed on the rest of the body).
    try:
        status, body = api_request(w, "POST", "/map/sizes", json.dumps(items[:1]).encode(), token=False)
        assert (status, json.loads(body)["error"]) == (413, "payload_too_large")
    except urllib.error.URLError as e:
        assert isinstance(e.reason, (BrokenPipeError, ConnectionResetError)), e


def test_a_lambdas_map_gets_results_of_20_mb(w):
    assert w.client.run("fanout", {"items": [{"make": MB20}, {"data": "abc"}]}) == [MB20, 3]
    assert blobs(w) == []


def test_an_item_whose_blob_is_missing_fails_alone(w):
    items = [{"$sprout_blob": "0" * 32 + ".json"}, {"data": "ok"}, {"$sprout_blob": "../etc/passwd"}]
    results = list(sprout.map("sizes", items, client=w.client, return_exceptions=True))
    assert isinstance(results[0], sprout.TaskError) and results[0].code == "invalid_json"
    assert "blob cannot be read" in results[0].message
    assert results[1] == 2
    assert isinstance(results[2], sprout.TaskError) and "not a blob's name" in results[2].message


def test_blob_routes_need_the_token_and_plain_names(w):
    assert oct((w.dir / "blobs").stat().st_mode & 0o7777) == "0o1733", "sandboxes create blobs but list none"
    assert api_request(w, "PUT", "/blobs/abc.json", b'"hi"')[0] == 200
    assert (w.dir / "blobs" / "abc.json").stat().st_uid == 0, "a client's blob is root's: no sandbox replaces it"
    assert api_request(w, "GET", "/blobs/abc.json") == (200, b'"hi"')
    assert api_request(w, "GET", "/blobs/abc.json", token=False)[0] == 401
    assert api_request(w, "PUT", "/blobs/x", b"1", token=False)[0] == 401
    status, body = api_request(w, "PUT", "/blobs/.hidden", b"1")
    assert (status, json.loads(body)["error"]) == (400, "invalid_request")
    assert api_request(w, "DELETE", "/blobs/abc.json")[0] == 200
    status, body = api_request(w, "GET", "/blobs/abc.json")
    assert (status, json.loads(body)["error"]) == (404, "not_found")
    assert api_request(w, "DELETE", "/blobs/abc.json")[0] == 404
    try:
        status, body = api_request(w, "PUT", "/blobs/big", b"\0" * ((50 << 20) + 1))
        assert (status, json.loads(body)["error"]) == (413, "payload_too_large")
    except urllib.error.URLError as e:  # closed on the rest of the body
        assert isinstance(e.reason, (BrokenPipeError, ConnectionResetError)), e
    assert blobs(w) == [], "a refused upload leaves nothing"
