"""Tenants as principals (issue 52): the operator makes tenants and issues them keys; a
tenant's key reaches only its own lambdas and their logs, another tenant's lambda answers as
one that does not exist, and revoked or expired keys are refused at once. The operator's token
still reaches everything; /run stays open."""

import json
import os
import stat
import time
import urllib.error
import urllib.request

import pytest

from conftest import SPROUT, targz

FUNCTION = "def f(event):\n    print('secret-of', event)\n    return 'ok'\n"
SHOW_AUTHORIZATION = '''
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [environ.get("HTTP_AUTHORIZATION", "(none)").encode()]
'''


def call(worker, method, path, key=None, body=None, json_body=None):
    """(status, parsed JSON or text, headers) with exactly this key (None: the operator's token)."""
    headers = {"Authorization": f"Bearer {key or worker.client.token().strip()}"}
    if json_body is not None:
        body = json.dumps(json_body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(worker.url + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            status, raw = reply.status, reply.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def upload(worker, name, key=None, source=FUNCTION):
    return call(worker, "POST", f"/registry/{name}", key, body=targz({"f.py": source}))


def issue(worker, tenant, **scope):
    status, body = call(worker, "POST", f"/tenants/{tenant}/keys", json_body=scope)
    assert status == 201, body
    return body


@pytest.fixture(scope="module")
def two_tenants(worker):
    """Tenants a and b, each with a key and a lambda that has run once; the operator's own."""
    for name in ("a", "b"):
        status, body = call(worker, "POST", "/tenants", json_body={"name": name})
        assert status == 201, body
    keys = {name: issue(worker, name)["key"] for name in ("a", "b")}
    for tenant in ("a", "b"):
        status, body = upload(worker, f"{tenant}-fn", keys[tenant])
        assert status == 201, body
        assert worker.client.run(f"{tenant}-fn", tenant) == "ok"
    assert upload(worker, "ops")[0] == 201
    return keys


def test_a_tenant_lists_and_shows_only_its_own_lambdas(worker, two_tenants):
    a = two_tenants["a"]
    assert call(worker, "GET", "/registry", a) == (200, ["a-fn"])
    status, body = call(worker, "GET", "/registry/a-fn", a)
    assert status == 200 and body["name"] == "a-fn"
    status, everything = call(worker, "GET", "/registry")
    assert status == 200 and {"a-fn", "b-fn", "ops", "echo"} <= set(everything)


@pytest.mark.parametrize("victim", ["b-fn", "ops"])
@pytest.mark.parametrize("method,path", [
    ("GET", "/registry/{}"),
    ("DELETE", "/registry/{}"),
    ("GET", "/logs/{}"),
    ("GET", "/logs/{}?follow=1"),
])
def test_another_principals_lambda_answers_as_one_that_does_not_exist(worker, two_tenants, victim, method, path):
    a = two_tenants["a"]
    status, body = call(worker, method, path.format(victim), a)
    missing_status, missing = call(worker, method, path.format("no-such-fn"), a)
    assert status == missing_status == 404, body
    assert body["error"] == missing["error"]
    assert body["message"].replace(victim, "X") == missing["message"].replace("no-such-fn", "X")
    # ...and it is still there for its owner and the operator.
    assert call(worker, "GET", f"/registry/{victim}")[0] == 200


def test_a_tenant_cannot_take_another_principals_name(worker, two_tenants):
    for victim in ("b-fn", "ops"):
        status, body = upload(worker, victim, two_tenants["a"], source="def f(e):\n    return 'taken over'\n")
        assert status == 409 and body["error"] == "name_taken", body
        assert worker.client.run(victim, "x") == "ok"


def test_a_request_of_another_tenants_lambda_shows_no_log_entries(worker, two_tenants):
    reply = urllib.request.urlopen(urllib.request.Request(worker.url + "/run/b-fn", data=b'"b"', method="POST"), timeout=60)
    request_id = reply.headers["X-Sprout-Request-Id"]
    reply.read()
    deadline = time.time() + 10
    while True:
        status, body = call(worker, "GET", f"/logs?request={request_id}")
        if status == 200 and body["entries"] or time.time() > deadline:
            break
        time.sleep(0.1)
    assert any("secret-of" in json.dumps(e) for e in body["entries"]), body
    assert call(worker, "GET", f"/logs?request={request_id}", two_tenants["b"])[1]["entries"]
    status, body = call(worker, "GET", f"/logs?request={request_id}", two_tenants["a"])
    assert (status, body) == (200, {"entries": []})
    status, own = call(worker, "GET", "/logs/a-fn", two_tenants["a"])
    assert status == 200 and own["lambda"] == "a-fn"


@pytest.mark.parametrize("method,path", [
    ("GET", "/stats"), ("GET", "/metrics"), ("GET", "/packages"),
    ("GET", "/pid"), ("GET", "/blobs"), ("GET", "/tenants"),
    ("POST", "/tenants"), ("GET", "/tenants/a/keys"), ("POST", "/tenants/a/keys"),
    ("DELETE", "/tenants/b"), ("GET", "/console/assets"), ("GET", "/nowhere"), ("GET", "/registry/a-fn/x"), ("GET", "/sites/a/b"),
])
def test_a_tenant_key_is_refused_where_only_the_operator_may_go(worker, two_tenants, method, path):
    status, body = call(worker, method, path, two_tenants["a"], body=b"{}" if method in ("POST", "PUT") else None)
    assert status == 403 and body["error"] == "forbidden", (method, path, body)
    assert "operator" in body["message"]


def test_a_read_only_key_reads_and_changes_nothing(worker, two_tenants):
    read_only = issue(worker, "a", read_only=True)["key"]
    assert call(worker, "GET", "/registry/a-fn", read_only)[0] == 200
    for method, path in [("DELETE", "/registry/a-fn"), ("POST", "/registry/a-new"), ("PUT", "/registry/a-fn")]:
        status, body = call(worker, method, path, read_only, body=targz({"f.py": FUNCTION}) if method != "DELETE" else None)
        assert status == 403 and "read-only" in body["message"], body
    assert call(worker, "GET", "/registry/a-fn")[0] == 200 and call(worker, "GET", "/registry/a-new")[0] == 404


def test_a_key_narrowed_to_some_lambdas_sees_and_changes_only_them(worker, two_tenants):
    assert upload(worker, "a-other", two_tenants["a"])[0] == 201
    narrow = issue(worker, "a", lambdas=["a-fn"])["key"]
    assert call(worker, "GET", "/registry", narrow) == (200, ["a-fn"])
    assert call(worker, "GET", "/registry/a-other", narrow)[0] == 404
    status, body = upload(worker, "a-third", narrow)
    assert status == 403 and "issued for" in body["message"], body
    assert upload(worker, "a-fn", narrow)[0] == 201  # a new version of its own lambda


def test_revoked_and_expired_keys_are_refused_at_once(worker, two_tenants):
    issued = issue(worker, "a")
    assert call(worker, "GET", "/registry", issued["key"])[0] == 200
    status, record = call(worker, "DELETE", f"/tenants/a/keys/{issued['id']}")
    assert status == 200 and record["revoked"] and "digest" not in record
    status, body = call(worker, "GET", "/registry", issued["key"])
    assert status == 403 and "revoked" in body["message"]
    short = issue(worker, "a", expires_in_s=1)
    assert call(worker, "GET", "/registry", short["key"])[0] == 200
    time.sleep(2.1)
    status, body = call(worker, "GET", "/registry", short["key"])
    assert status == 403 and "expired" in body["message"]
    # A key shaped like one but unknown, and a known id with a wrong secret.
    for forged in ["spk_" + "0" * 16 + "_" + "0" * 64, issued["key"][:-1] + ("0" if issued["key"][-1] != "0" else "1")]:
        status, body = call(worker, "GET", "/registry", forged)
        assert status == 403, body


def test_keys_are_listed_without_secrets_and_stored_hashed(worker, two_tenants):
    issued = issue(worker, "b", read_only=True)
    status, keys = call(worker, "GET", "/tenants/b/keys")
    assert status == 200 and issued["id"] in [k["id"] for k in keys]
    secret = issued["key"].rsplit("_", 1)[1]
    assert secret not in json.dumps(keys) and all("digest" not in k and "key" not in k for k in keys)
    stored = worker.dir / "tenants.json"
    assert stat.S_IMODE(os.stat(stored).st_mode) == 0o600
    assert secret not in stored.read_text() and issued["key"] not in stored.read_text()


def test_run_stays_open_and_no_lambda_sees_a_tenant_key(worker, two_tenants):
    a = two_tenants["a"]
    status, body = upload(worker, "a-show", a, source=SHOW_AUTHORIZATION)
    assert status == 201, body
    request = urllib.request.Request(worker.url + "/run/a-show", headers={"Authorization": f"Bearer {a}"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert reply.read() == b"(none)"
    assert worker.client.run("b-fn", "from anyone") == "ok"


@pytest.mark.parametrize("body,code", [
    (b"not json", "invalid_request"),
    (b'{"name": "x", "extra": 1}', "invalid_request"),
    (b'{"name": "bad/name"}', "invalid_name"),
    (b'{"name": ""}', "invalid_name"),
    (b'{"name": "a"}', "tenant_exists"),
])
def test_malformed_tenant_requests_get_clear_errors(worker, two_tenants, body, code):
    status, reply = call(worker, "POST", "/tenants", body=body)
    assert reply["error"] == code and status in (400, 409), reply
    assert call(worker, "GET", "/registry", two_tenants["a"])[0] == 200


def test_malformed_key_requests_get_clear_errors(worker, two_tenants):
    assert call(worker, "POST", "/tenants/nobody/keys", json_body={})[1]["error"] == "tenant_not_found"
    assert call(worker, "POST", "/tenants/a/keys", json_body={"expires_in_s": 0})[1]["error"] == "invalid_request"
    assert call(worker, "POST", "/tenants/a/keys", json_body={"lambdas": ["../x"]})[1]["error"] == "invalid_name"
    assert call(worker, "POST", "/tenants/a/keys", json_body={"scope": "all"})[1]["error"] == "invalid_request"
    assert call(worker, "DELETE", "/tenants/a/keys/0000")[1]["error"] == "key_not_found"


def test_a_tenant_owning_lambdas_is_not_removed_and_its_keys_die_with_it(make_worker):
    worker = make_worker()
    assert call(worker, "POST", "/tenants", json_body={"name": "t"})[0] == 201
    key = issue(worker, "t")["key"]
    assert upload(worker, "t-fn", key)[0] == 201
    status, body = call(worker, "DELETE", "/tenants/t")
    assert status == 409 and body["error"] == "tenant_not_empty", body
    assert call(worker, "GET", "/registry/t-fn", key)[0] == 200
    # Kept across a restart: the tenant, its key and what it owns.
    worker.stop()
    worker.start()
    assert call(worker, "GET", "/registry", key) == (200, ["t-fn"])
    assert call(worker, "DELETE", "/registry/t-fn", key)[0] == 200
    assert call(worker, "GET", "/tenants")[1] == [{"name": "t", "lambdas": 0, "keys": 1}]
    assert call(worker, "DELETE", "/tenants/t") == (200, {"deleted": "t"})
    assert call(worker, "GET", "/registry", key)[0] == 403
    # The name is free again, for anyone.
    assert upload(worker, "t-fn")[0] == 201


def test_the_cli_makes_tenants_and_issues_and_revokes_keys(worker):
    env = {**os.environ, "SPROUT_URL": worker.url, "SPROUT_TOKEN": worker.client.token().strip()}

    def cli(*args):
        return __import__("subprocess").run([str(SPROUT), *args], capture_output=True, text=True, env=env, timeout=60)

    added = cli("tenants", "add", "cli-t")
    assert added.returncode == 0 and "added tenant cli-t" in added.stdout, added.stderr
    issued = cli("keys", "add", "cli-t", "--read-only", "--lambda", "x", "--expires-in", "3600")
    assert issued.returncode == 0, issued.stderr
    key, line = issued.stdout.splitlines()[:2]
    assert key.startswith("spk_") and "read-only, lambdas x, expires in" in line
    key_id = key.split("_")[1]
    listed = cli("keys", "ls", "cli-t")
    assert key_id in listed.stdout and key not in listed.stdout
    assert cli("tenants", "ls").stdout.split("\n")[0].split() == ["TENANT", "LAMBDAS", "KEYS"]
    assert cli("keys", "revoke", "cli-t", key_id).returncode == 0
    assert "revoked" in cli("keys", "ls", "cli-t").stdout
    missing = cli("keys", "add", "nobody")
    assert missing.returncode != 0 and "tenant_not_found" in missing.stderr + missing.stdout
    assert cli("tenants", "rm", "cli-t").returncode == 0


def test_every_change_is_audited_with_its_key_and_each_tenant_reads_its_own(make_worker):
    worker = make_worker()
    for name in ("a", "b"):
        assert call(worker, "POST", "/tenants", json_body={"name": name})[0] == 201
    a, b = issue(worker, "a"), issue(worker, "b")
    assert upload(worker, "a-fn", a["key"])[0] == 201
    assert upload(worker, "b-fn", b["key"])[0] == 201
    assert upload(worker, "b-fn", a["key"])[0] == 409  # a tries b's name
    assert call(worker, "DELETE", "/registry/b-fn", a["key"])[0] == 404
    assert call(worker, "DELETE", f"/tenants/a/keys/{a['id']}")[0] == 200
    assert upload(worker, "a-fn", a["key"])[0] == 403  # revoked
    worker.client.run("a-fn", "not audited")

    status, body = call(worker, "GET", "/audit")
    assert status == 200
    seen = [(e["actor"], e.get("tenant"), e.get("key"), e["method"], e["path"], e["status"]) for e in body["entries"]]
    assert seen == [
        ("operator", None, None, "POST", "/tenants", 201),
        ("operator", None, None, "POST", "/tenants", 201),
        ("operator", None, None, "POST", "/tenants/a/keys", 201),
        ("operator", None, None, "POST", "/tenants/b/keys", 201),
        ("tenant", "a", a["id"], "POST", "/registry/a-fn", 201),
        ("tenant", "b", b["id"], "POST", "/registry/b-fn", 201),
        ("tenant", "a", a["id"], "POST", "/registry/b-fn", 409),
        ("tenant", "a", a["id"], "DELETE", "/registry/b-fn", 404),
        ("operator", None, None, "DELETE", f"/tenants/a/keys/{a['id']}", 200),
        ("refused", None, a["id"], "POST", "/registry/a-fn", 403),
    ]
    assert all(e["request_id"] and e["time"].endswith("Z") for e in body["entries"])
    # b sees what it did and what the operator did to it: not a's attempts on its name.
    status, mine = call(worker, "GET", "/audit", b["key"])
    assert status == 200
    assert [(e["method"], e["path"]) for e in mine["entries"]] == [("POST", "/tenants/b/keys"), ("POST", "/registry/b-fn")]
    assert "a" not in {e.get("tenant") for e in mine["entries"]}
    assert call(worker, "GET", "/audit?limit=1")[1]["entries"][0]["status"] == 403
    for bad in ("limit=0", "limit=x", "since=1"):
        assert call(worker, "GET", f"/audit?{bad}")[1]["error"] == "invalid_request"
    stored = worker.dir / "audit.log"
    assert stat.S_IMODE(os.stat(stored).st_mode) == 0o600
    assert a["key"] not in stored.read_text() and b["key"] not in stored.read_text()


CALLER = '''
import sprout
def f(event):
    try:
        return {"got": sprout.invoke(event, "hi")}
    except sprout.InvokeError as e:
        return {"error": e.code, "message": e.message}
'''


def test_a_tenants_lambda_invokes_only_its_own_tenants_lambdas(worker, two_tenants):
    a = two_tenants["a"]
    assert upload(worker, "a-caller", a, source=CALLER)[0] == 201
    assert worker.client.run("a-caller", "a-fn") == {"got": "ok"}
    for other in ("b-fn", "ops", "no-such-fn"):
        missing = {"error": "lambda_not_found", "message": f'no lambda named "{other}"'}
        assert worker.client.run("a-caller", other) == missing
    # The operator's lambdas call anyone's.
    assert upload(worker, "ops-caller", source=CALLER)[0] == 201
    assert worker.client.run("ops-caller", "b-fn") == {"got": "ok"}


KEYED = "auth: key\n"


def run_with(worker, name, key=None, path=""):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(f"{worker.url}/run/{name}{path}", data=b'"x"', method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read()), reply.headers
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), err.headers


def test_a_lambda_that_wants_a_key_takes_its_tenants_keys_and_the_operators_token(worker, two_tenants):
    a, b = two_tenants["a"], two_tenants["b"]
    archive = targz({"f.py": FUNCTION, "ol.yaml": KEYED})
    assert call(worker, "POST", "/registry/a-keyed", a, body=archive)[0] == 201
    status, body, headers = run_with(worker, "a-keyed")
    assert status == 401 and body["error"] == "unauthorized" and "auth: key" in body["message"]
    assert headers["WWW-Authenticate"] == 'Bearer realm="sprout"'
    assert run_with(worker, "a-keyed", a)[:2] == (200, "ok")
    assert run_with(worker, "a-keyed", worker.client.token().strip())[:2] == (200, "ok")
    narrow = issue(worker, "a", lambdas=["a-fn"])["key"]
    for refused in (b, narrow, "not-a-key", "spk_" + "1" * 16 + "_" + "2" * 64):
        status, body, _ = run_with(worker, "a-keyed", refused)
        assert status == 403 and body["error"] == "forbidden", (refused, body)
    # /map takes the same check.
    request = urllib.request.Request(f"{worker.url}/map/a-keyed", data=b'["x", "y"]', method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 401
    request.add_header("Authorization", f"Bearer {a}")
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert json.loads(reply.read()) == [{"result": "ok"}, {"result": "ok"}]
    # A revoked key is refused at once; a wrong ol.yaml value is refused at upload.
    revoked = issue(worker, "a")
    assert run_with(worker, "a-keyed", revoked["key"])[0] == 200
    call(worker, "DELETE", f"/tenants/a/keys/{revoked['id']}")
    assert run_with(worker, "a-keyed", revoked["key"])[0] == 403
    status, body = call(worker, "POST", "/registry/a-bad", a, body=targz({"f.py": FUNCTION, "ol.yaml": "auth: maybe\n"}))
    assert status == 400 and body["error"] == "invalid_lambda_config" and "none or key" in body["message"]
    assert call(worker, "GET", "/registry/a-bad", a)[0] == 404  # the failed upload claimed nothing
    assert call(worker, "GET", "/registry/a-keyed", a)[1]["config"]["auth"] == "key"


SLEEPER = "import time\ndef f(event):\n    time.sleep(event or 0)\n    return 'slept'\n"


def run_status(worker, name, event=None):
    request = urllib.request.Request(f"{worker.url}/run/{name}", data=json.dumps(event).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_quotas_on_lambdas_code_rate_and_concurrency_refuse_with_the_limit_named(make_worker):
    from concurrent.futures import ThreadPoolExecutor

    worker = make_worker()
    for name in ("q", "other"):
        assert call(worker, "POST", "/tenants", json_body={"name": name})[0] == 201
    key, other = issue(worker, "q")["key"], issue(worker, "other")["key"]
    status, body = call(worker, "PUT", "/tenants/q/quotas", json_body={"lambdas": 2, "code_mb": 1})
    assert status == 200 and body["quotas"] == {"lambdas": 2, "code_mb": 1}
    assert upload(worker, "q-one", key)[0] == 201
    assert upload(worker, "q-two", key, source=SLEEPER)[0] == 201
    status, body = upload(worker, "q-three", key)
    assert status == 429 and body["error"] == "quota_exceeded", body
    assert (body["quota"], body["limit"], body["tenant"]) == ("lambdas", 2, "q") and "2 lambdas" in body["message"]
    assert upload(worker, "q-one", key)[0] == 201  # a new version of its own: not one more lambda
    big = targz({"f.py": FUNCTION, "blob.txt": os.urandom(1536 << 10).hex()})  # about 1.7 MB gzipped
    status, body = call(worker, "POST", "/registry/q-one", key, body=big)
    assert status == 413 and body["error"] == "code_quota_exceeded" and body["quota"] == "code_mb", body
    assert worker.client.run("q-one", "x") == "ok"  # the version before is kept

    # Rate: a burst of one second's worth, then refused at once; another tenant untouched.
    assert call(worker, "PUT", "/tenants/q/quotas", json_body={"invocations_per_s": 5})[0] == 200
    assert upload(worker, "other-fn", other)[0] == 201
    with ThreadPoolExecutor(8) as pool:
        mine = list(pool.map(lambda _: run_status(worker, "q-one", "x")[0], range(30)))
        theirs = list(pool.map(lambda _: run_status(worker, "other-fn", "x")[0], range(30)))
    # 5 at once, then 5 a second while the 30 are sent (however slowly the host runs them).
    assert mine.count(200) >= 5 and mine.count(429) >= 10 and mine.count(200) + mine.count(429) == 30, mine
    assert theirs == [200] * 30
    status, body = run_status(worker, "q-one", "x")
    assert status == 429 and body["quota"] == "invocations_per_s" and body["limit"] == 5
    time.sleep(1.1)
    assert run_status(worker, "q-one", "x")[0] == 200

    # Concurrency: one in flight; the second is refused while the first sleeps.
    assert call(worker, "PUT", "/tenants/q/quotas", json_body={"concurrent": 1})[0] == 200
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(run_status, worker, "q-two", 1.5)
        time.sleep(0.5)
        status, body = run_status(worker, "q-one", "x")
        assert status == 429 and body["quota"] == "concurrent", body
        assert slow.result() == (200, "slept")
    assert run_status(worker, "q-one", "x")[0] == 200

    status, shown = call(worker, "GET", "/tenants/q")
    assert status == 200 and shown["quotas"] == {"concurrent": 1} and shown["lambdas"] == ["q-one", "q-two"]
    assert shown["usage"]["in_flight"] == 0 and shown["usage"]["refused"]["invocations_per_s"] >= 11
    metrics = call(worker, "GET", "/metrics")[1]
    for quota in ("lambdas", "code_mb", "invocations_per_s", "concurrent"):
        assert f'sprout_tenant_quota_refusals_total{{tenant="q",quota="{quota}"}}' in metrics, quota
    # Bad limits and unknown tenants are refused, the quotas kept.
    for bad in ({"invocations_per_s": 0}, {"concurrent": 0}, {"lambdaz": 1}, {"lambdas": -1}):
        status, body = call(worker, "PUT", "/tenants/q/quotas", json_body=bad)
        assert status == 400 and body["error"] == "invalid_request", (bad, body)
    assert call(worker, "PUT", "/tenants/nobody/quotas", json_body={})[1]["error"] == "tenant_not_found"
    assert call(worker, "GET", "/tenants/q")[1]["quotas"] == {"concurrent": 1}
    assert call(worker, "GET", "/tenants/q", key)[0] == 403


def test_a_tenant_serves_its_own_lambdas_on_its_own_hosts_only(make_worker):
    from conftest import free_port

    app_port = free_port()
    worker = make_worker(app={"listen": f"127.0.0.1:{app_port}", "sites": {"conf.example": {"lambda": "ops"}}})
    for name in ("a", "b"):
        assert call(worker, "POST", "/tenants", json_body={"name": name})[0] == 201
    a, b = issue(worker, "a")["key"], issue(worker, "b")["key"]
    assert upload(worker, "a-web", a, source=SHOW_AUTHORIZATION)[0] == 201
    assert upload(worker, "b-fn", b)[0] == 201
    assert upload(worker, "ops")[0] == 201
    assert call(worker, "PUT", "/sites/ops.example", json_body={"lambda": "ops"})[0] == 201

    status, body = call(worker, "PUT", "/sites/A.Example:8080", a, json_body={"lambda": "a-web"})
    assert status == 201, body
    request = urllib.request.Request(f"http://127.0.0.1:{app_port}/", headers={"Host": "a.example"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert reply.read() == b"(none)"
    refusals = [
        ("PUT", "/sites/b.example", {"lambda": "b-fn"}, 404, "lambda_not_found"),  # b's lambda
        ("PUT", "/sites/a2.example", {"lambda": "ops"}, 404, "lambda_not_found"),  # the operator's
        ("PUT", "/sites/ops.example", {"lambda": "a-web"}, 409, "name_taken"),  # the operator's host
        ("PUT", "/sites/conf.example", {"lambda": "a-web"}, 409, "name_taken"),  # config.toml's
        ("PUT", "/sites/a3.example", {"lambda": "a-web", "static": {"/s/": "/etc"}}, 403, "forbidden"),
        ("DELETE", "/sites/ops.example", None, 404, "site_not_found"),
    ]
    for method, path, body, status, code in refusals:
        got, reply = call(worker, method, path, a, json_body=body)
        assert (got, reply["error"]) == (status, code), (method, path, reply)
    status, body = call(worker, "PUT", "/sites/a.example", b, json_body={"lambda": "b-fn"})
    assert (status, body["error"]) == (409, "name_taken")
    assert call(worker, "DELETE", "/sites/a.example", b)[1]["error"] == "site_not_found"
    assert set(call(worker, "GET", "/sites", a)[1]) == {"a.example"}
    assert call(worker, "GET", "/sites", b) == (200, {})
    assert {"a.example", "ops.example", "conf.example"} <= set(call(worker, "GET", "/sites")[1])
    # Its host keeps it from being removed; deleting the site frees the host.
    assert call(worker, "DELETE", "/registry/a-web", a)[0] == 200
    assert call(worker, "DELETE", "/tenants/a")[1]["error"] == "tenant_not_empty"
    assert call(worker, "DELETE", "/sites/a.example", a) == (200, {"deleted": "a.example"})
    assert call(worker, "DELETE", "/tenants/a")[0] == 200
    assert call(worker, "PUT", "/sites/a.example", b, json_body={"lambda": "b-fn"})[0] == 201


def test_a_refused_client_keeps_its_connection(make_worker):
    import http.client

    worker = make_worker()
    assert call(worker, "POST", "/tenants", json_body={"name": "r"})[0] == 201
    key = issue(worker, "r")["key"]
    assert upload(worker, "r-fn", key)[0] == 201
    assert call(worker, "PUT", "/tenants/r/quotas", json_body={"invocations_per_s": 1})[0] == 200
    conn = http.client.HTTPConnection("127.0.0.1", worker.port, timeout=30)
    statuses = []
    for _ in range(4):
        conn.request("POST", "/run/r-fn", body=b'"x"', headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        reply.read()
        statuses.append(reply.status)
        assert not reply.will_close
    assert statuses[0] == 200 and statuses[1:] == [429, 429, 429], statuses
    conn.close()


KERNEL = "import platform\ndef f(e):\n    return platform.release()\n"


def test_the_operator_puts_a_tenant_in_an_isolation_class(make_worker):
    worker = make_worker(sandbox={"backend": "sock", "start_timeout_ms": 60000}, isolation={"classes": ["gvisor"]},
                         gvisor={"pod_idle_ms": 500}, limits={"timeout_ms": 30000})
    assert call(worker, "POST", "/tenants", json_body={"name": "sealed"})[0] == 201
    key = issue(worker, "sealed")["key"]
    assert call(worker, "PUT", "/tenants/sealed/isolation", json_body={"class": "gvisor"}) == (
        200, {"name": "sealed", "isolation": "gvisor"})
    status, body = upload(worker, "sealed-fn", key, source=KERNEL)
    assert status == 201 and body["backend"] == "gvisor", body
    assert "gvisor" in worker.client.run("sealed-fn")
    assert upload(worker, "ops-fn", source=KERNEL)[1]["backend"] == "sock"  # the operator's: the worker's policy
    # ?isolation= is the operator's, not a tenant's.
    status, body = call(worker, "POST", "/registry/sealed-fn?isolation=sock", key, body=targz({"f.py": KERNEL}))
    assert status == 403 and "operator" in body["message"], body
    for bad in ({"class": "runc"}, {"class": "firecracker"}, {"klass": "gvisor"}):
        status, body = call(worker, "PUT", "/tenants/sealed/isolation", json_body=bad)
        assert status == 400 and body["error"] == "invalid_request", (bad, body)
    assert call(worker, "GET", "/tenants/sealed")[1]["isolation"] == "gvisor"
    assert call(worker, "PUT", "/tenants/sealed/isolation", json_body={"class": None})[1]["isolation"] is None
    assert upload(worker, "sealed-two", key, source=KERNEL)[1]["backend"] == "sock"
    assert call(worker, "PUT", "/tenants/nobody/isolation", json_body={"class": "gvisor"})[1]["error"] == "tenant_not_found"


def test_a_tenant_leases_its_own_lambdas_and_sees_only_its_leases(worker, two_tenants):
    a, b = two_tenants["a"], two_tenants["b"]
    status, lease = call(worker, "POST", "/leases/a-fn", a, json_body={"parts": 1, "idle_timeout_s": 60})
    assert status == 201, lease
    lid = lease["lease"]
    try:
        assert call(worker, "POST", "/leases/b-fn", a, json_body={"parts": 1})[1]["error"] == "lambda_not_found"
        assert call(worker, "POST", "/leases/ops", a, json_body={"parts": 1})[1]["error"] == "lambda_not_found"
        for method, path, body in [("POST", f"/leases/{lid}/0", b'"x"'), ("POST", f"/leases/{lid}/keepalive", b""),
                                   ("PUT", f"/leases/{lid}/files/f.txt", b"data"), ("GET", f"/leases/{lid}/files/f.txt", None),
                                   ("DELETE", f"/leases/{lid}", None)]:
            status, reply = call(worker, method, path, b, body=body)
            missing_status, missing = call(worker, method, path.replace(lid, "l-nope"), b, body=body)
            assert (status, reply["error"]) == (404, "lease_not_found") == (missing_status, missing["error"]), (method, path, reply)
        assert call(worker, "GET", "/leases", b) == (200, [])
        assert [x["lease"] for x in call(worker, "GET", "/leases", a)[1]] == [lid]
        assert lid in [x["lease"] for x in call(worker, "GET", "/leases")[1]]
        assert call(worker, "POST", f"/leases/{lid}/0", a, body=b'"x"') == (200, "ok")
        assert call(worker, "PUT", f"/leases/{lid}/files/f.txt", a, body=b"data")[0] == 200
    finally:
        assert call(worker, "DELETE", f"/leases/{lid}", a)[0] == 200


def test_a_tenant_uses_the_cli_with_its_key(worker, two_tenants):
    env = {**os.environ, "SPROUT_URL": worker.url, "SPROUT_TOKEN": two_tenants["a"]}

    def cli(*args):
        return __import__("subprocess").run([str(SPROUT), *args], capture_output=True, text=True, env=env, timeout=60)

    listed = cli("ls")
    assert listed.returncode == 0, listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines()[1:] if line.strip()]
    assert "a-fn" in names and "b-fn" not in names and "ops" not in names, listed.stdout
    assert cli("show", "a-fn").returncode == 0
    refused = cli("show", "b-fn")
    assert refused.returncode != 0 and "lambda_not_found" in refused.stderr + refused.stdout
    assert cli("stats").returncode != 0  # the worker's figures are the operator's
