"""Tenants' resources beyond lambdas (issue 52): blobs belong to the key that uploaded them,
and the quotas on stored files, memory in flight and log output hold, each refusal naming its
quota; a tenant flooding its invocation quota yields the CPU to the others."""

import http.client
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor

from test_tenants import FUNCTION, SLEEPER, call, issue, run_status, upload

from conftest import targz


def tenants(worker, *names):
    """Make tenants `names`, each with a key; their keys by name."""
    for name in names:
        assert call(worker, "POST", "/tenants", json_body={"name": name})[0] == 201
    return {name: issue(worker, name)["key"] for name in names}


def test_a_tenants_blobs_are_its_own_and_anothers_answer_as_missing(make_worker):
    worker = make_worker()
    keys = tenants(worker, "a", "b")
    a, b = keys["a"], keys["b"]
    assert call(worker, "PUT", "/blobs/a-blob", a, body=b"of a") == (200, {"blob": "a-blob", "bytes": 4})
    assert call(worker, "PUT", "/blobs/ops-blob", body=b"of the operator")[0] == 200
    assert call(worker, "GET", "/blobs/a-blob", a) == (200, "of a")
    for victim in ("a-blob", "ops-blob"):
        for method, body in (("GET", None), ("PUT", b"taken"), ("DELETE", None)):
            status, reply = call(worker, method, f"/blobs/{victim}", b, body=body)
            missing_status, missing = call(worker, "GET", "/blobs/no-such-blob", b)
            assert (status, reply["error"]) == (404, "not_found") == (missing_status, missing["error"]), (victim, method, reply)
            assert reply["message"] == missing["message"], "the same words: nothing disclosed"
    # Untouched: its owner and the operator still read it.
    assert call(worker, "GET", "/blobs/a-blob", a) == (200, "of a")
    assert call(worker, "GET", "/blobs/a-blob") == (200, "of a")
    assert call(worker, "GET", "/blobs/ops-blob") == (200, "of the operator")
    # A read-only key reads its tenant's blobs and writes none.
    reader = issue(worker, "a", read_only=True)["key"]
    assert call(worker, "GET", "/blobs/a-blob", reader) == (200, "of a")
    assert call(worker, "PUT", "/blobs/a-blob", reader, body=b"x")[0] == 403
    # Deleted by its owner, the name is free; bad names are refused.
    assert call(worker, "DELETE", "/blobs/a-blob", a)[0] == 200
    assert call(worker, "GET", "/blobs/a-blob", a)[0] == 404
    assert call(worker, "PUT", "/blobs/a-blob", b, body=b"of b")[0] == 200
    assert call(worker, "GET", "/blobs/.hidden", a)[1]["error"] == "invalid_request"


def test_stored_files_count_blobs_and_lease_files_against_files_mb(make_worker):
    worker = make_worker()
    key = tenants(worker, "s")["s"]
    assert call(worker, "PUT", "/tenants/s/quotas", json_body={"files_mb": 1})[0] == 200
    assert call(worker, "PUT", "/blobs/first", key, body=os.urandom(700 << 10))[0] == 200
    status, body = call(worker, "PUT", "/blobs/second", key, body=os.urandom(500 << 10))
    assert status == 413 and body["error"] == "files_quota_exceeded", body
    assert (body["quota"], body["limit"], body["tenant"]) == ("files_mb", 1, "s") and "1 MB of stored files" in body["message"]
    assert call(worker, "GET", "/blobs/second", key)[0] == 404, "a refused upload leaves nothing"
    # Its body unread, the connection closes after the refusal and says so.
    conn = http.client.HTTPConnection(worker.url.split("//")[1], timeout=30)
    conn.request("PUT", "/blobs/third", body=os.urandom(500 << 10), headers={"Authorization": f"Bearer {key}"})
    reply = conn.getresponse()
    assert (reply.status, reply.getheader("Connection")) == (413, "close")
    conn.close()
    # Replacing a blob counts the new one, not both.
    assert call(worker, "PUT", "/blobs/first", key, body=os.urandom(900 << 10))[0] == 200
    # Its leases' files count too, and are refused the same way.
    assert upload(worker, "s-fn", key)[0] == 201
    status, lease = call(worker, "POST", "/leases/s-fn", key, json_body={"parts": 1, "idle_timeout_s": 60})
    assert status == 201, lease
    lid = lease["lease"]
    try:
        status, body = call(worker, "PUT", f"/leases/{lid}/files/big.bin", key, body=os.urandom(200 << 10))
        assert status == 413 and body["quota"] == "files_mb", body
        assert call(worker, "DELETE", "/blobs/first", key)[0] == 200
        assert call(worker, "PUT", f"/leases/{lid}/files/big.bin", key, body=os.urandom(200 << 10))[0] == 200
        shown = call(worker, "GET", "/tenants/s")[1]
        assert shown["usage"]["files_bytes"] == 200 << 10 and shown["usage"]["refused"]["files_mb"] == 3, shown
    finally:
        assert call(worker, "DELETE", f"/leases/{lid}", key)[0] == 200
    assert 'sprout_tenant_quota_refusals_total{tenant="s",quota="files_mb"} 3' in call(worker, "GET", "/metrics")[1]
    # The operator's uploads have no quota but limits.max_upload_mb.
    assert call(worker, "PUT", "/blobs/ops", body=os.urandom(2 << 20))[0] == 200


def test_memory_in_flight_is_bounded_by_memory_mb(make_worker):
    worker = make_worker()
    key = tenants(worker, "m")["m"]
    assert upload(worker, "m-sleep", key, source=SLEEPER)[0] == 201
    status, body = call(worker, "PUT", "/tenants/m/quotas", json_body={"memory_mb": 64})
    assert status == 400 and "one sandbox's memory limit (128 MB" in body["message"], body
    assert call(worker, "PUT", "/tenants/m/quotas", json_body={"memory_mb": 200})[0] == 200
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(run_status, worker, "m-sleep", 1.5)
        time.sleep(0.5)
        status, body = run_status(worker, "m-sleep", 0)
        assert status == 429 and (body["quota"], body["limit"]) == ("memory_mb", 200), body
        assert slow.result() == (200, "slept")
    assert run_status(worker, "m-sleep", 0) == (200, "slept")


LOUD = "def f(event):\n    for i in range(640):\n        print('x' * 99)\n    return 'said'\n"  # 64,000 bytes


def test_a_tenants_lambdas_share_its_log_rate(make_worker):
    worker = make_worker()
    keys = tenants(worker, "noisy", "quiet")
    assert call(worker, "PUT", "/tenants/noisy/quotas", json_body={"log_kb_s": 4})[0] == 200
    for tenant in keys:
        assert upload(worker, f"{tenant}-loud", keys[tenant], source=LOUD)[0] == 201
        assert worker.client.run(f"{tenant}-loud") == "said"
    assert worker.client.run("noisy-loud") == "said"

    def out_lines(name):
        entries = call(worker, "GET", f"/logs/{name}?limit=10000", keys[name.split("-")[0]])[1]["entries"]
        return entries, sum(e["type"] == "out" for e in entries)

    deadline = time.time() + 10
    while out_lines("quiet-loud")[1] < 640 and time.time() < deadline:
        time.sleep(0.2)
    assert out_lines("quiet-loud")[1] == 640, "the other tenant keeps all its output"
    entries, kept = out_lines("noisy-loud")
    assert kept < 640, kept
    dropped = [e for e in entries if e["type"] == "dropped"]
    assert dropped and "(its log_kb_s quota)" in dropped[0]["message"], entries[-3:]
    metrics = call(worker, "GET", "/metrics")[1]
    found = re.search(r'sprout_tenant_log_dropped_bytes_total\{tenant="noisy"\} (\d+)', metrics)
    assert found and int(found.group(1)) > 64_000, metrics
    assert 'sprout_tenant_log_dropped_bytes_total{tenant="quiet"}' not in metrics
    assert call(worker, "GET", "/tenants/noisy")[1]["usage"]["log_dropped_bytes"] == int(found.group(1))
    assert call(worker, "PUT", "/tenants/noisy/quotas", json_body={"log_kb_s": 0})[0] == 400


def test_a_tenant_flooding_its_rate_quota_runs_idle_on_the_cpu(make_worker):
    worker = make_worker(limits={"long_request_ms": 50})
    keys = tenants(worker, "flood", "calm")
    for tenant in keys:
        assert upload(worker, f"{tenant}-fn", keys[tenant])[0] == 201
        assert run_status(worker, f"{tenant}-fn", "warm")[0] == 200
    idled = lambda: worker.client.stats()["lambdas"]["long_requests_idled"]  # noqa: E731
    assert call(worker, "PUT", "/tenants/flood/quotas", json_body={"invocations_per_s": 2})[0] == 200
    before = idled()
    for _ in range(5):
        assert run_status(worker, "calm-fn", "x")[0] == 200
    assert idled() == before, "no tenant at its quota: nothing yields"
    # Flood until refused (on a slow host a token may come back between calls, and a call
    # let through after a refusal runs idle too): counted from the last refusal on.
    statuses = []
    while len(statuses) < 20 and statuses[-1:] != [429]:
        statuses.append(run_status(worker, "flood-fn", "x")[0])
    assert statuses[-1] == 429, statuses
    refused = idled()
    time.sleep(0.6)  # a token again, within a second of the refusal
    assert run_status(worker, "flood-fn", "x")[0] == 200
    assert idled() == refused + 1, "the flooding tenant's call ran idle"
    assert run_status(worker, "calm-fn", "x")[0] == 200
    assert idled() == refused + 1, "the other tenant's did not"
    time.sleep(1.2)  # past a second since its last refusal: no longer at its quota
    assert run_status(worker, "flood-fn", "x")[0] == 200
    assert idled() == refused + 1


def test_an_archive_of_a_tenant_counts_nothing_against_files_mb(make_worker):
    """Code is `code_mb`'s: a tenant at its files quota still deploys."""
    worker = make_worker()
    key = tenants(worker, "c")["c"]
    assert call(worker, "PUT", "/tenants/c/quotas", json_body={"files_mb": 0})[0] == 200
    assert call(worker, "PUT", "/blobs/any", key, body=b"x")[1]["error"] == "files_quota_exceeded"
    assert call(worker, "POST", "/registry/c-fn", key, body=targz({"f.py": FUNCTION}))[0] == 201


def test_the_cli_sets_every_quota(make_worker):
    import subprocess

    from conftest import SPROUT

    worker = make_worker()
    tenants(worker, "cli")
    env = {**os.environ, "SPROUT_URL": worker.url, "SPROUT_TOKEN": worker.client.token().strip()}
    done = subprocess.run([str(SPROUT), "tenants", "quota", "cli", "--memory-mb", "256", "--log-kb-s", "8", "--files-mb", "3",
                           "--concurrent", "2"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "files_mb 3" in done.stdout and "log_kb_s 8" in done.stdout, done.stdout
    assert call(worker, "GET", "/tenants/cli")[1]["quotas"] == {"memory_mb": 256, "log_kb_s": 8, "files_mb": 3, "concurrent": 2}
