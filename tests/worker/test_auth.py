"""The admin plane behind a bearer token: every endpoint of worker.listen but /run/... and
GET /status needs DIR/api-token; clients find it in /run/sprout/api/<listen> while the worker
runs; `auth = false` opens everything."""

import json
import os
import signal
import stat
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import sprout
import sprout.client
from conftest import EXAMPLES, SPROUT, targz

DISCOVERY = Path("/run/sprout/api")

PROTECTED = [
    ("GET", "/registry"),
    ("GET", "/registry/echo"),
    ("POST", "/registry/intruder"),
    ("PUT", "/registry/intruder"),
    ("DELETE", "/registry/echo"),
    ("PATCH", "/registry"),
    ("GET", "/stats"),
    ("GET", "/metrics"),
    ("GET", "/packages"),
    ("GET", "/pid"),
    ("POST", "/status"),
    ("GET", "/nowhere"),  # unknown paths do not say that they do not exist
    ("GET", "/"),
]

SHOW_AUTHORIZATION = '''
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [environ.get("HTTP_AUTHORIZATION", "(none)").encode()]
'''


def raw(worker, method, path, headers=None, body=None):
    """A request with exactly these headers (no client adds a token): (status, headers, body)."""
    if body is None and method in ("POST", "PUT"):
        body = targz({"f.py": "def f(event):\n    return 'intruder'\n"})
    request = urllib.request.Request(worker.url + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.headers, reply.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def token_of(worker):
    return (worker.dir / "api-token").read_text().strip()


def discovery_file(worker):
    return DISCOVERY / f"127.0.0.1:{worker.port}"


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("method,path", PROTECTED)
def test_without_a_token_the_admin_plane_answers_401(worker, method, path):
    status, headers, body = raw(worker, method, path)
    assert status == 401, (method, path, body)
    assert headers["WWW-Authenticate"] == 'Bearer realm="sprout"'
    assert headers["Content-Type"] == "application/json"
    error = json.loads(body)
    assert error["error"] == "unauthorized"
    assert "Authorization: Bearer" in error["message"] and "DIR/api-token" in error["message"]
    assert "$SPROUT_TOKEN" in error["message"] and f"/run/sprout/api/127.0.0.1:{worker.port}" in error["message"]
    assert token_of(worker) not in error["message"]


@pytest.mark.parametrize("authorization", ["Bearer " + "0" * 64, "Bearer wrong", "bearer x y", "Basic YWRhOmFkYQ==",
                                           "Bearer", "TOKEN"])
def test_a_wrong_token_or_a_malformed_header_is_403(worker, authorization):
    if authorization == "TOKEN":
        authorization = token_of(worker)  # the right token without its scheme
    for method, path in [("GET", "/stats"), ("DELETE", "/registry/echo"), ("POST", "/registry/intruder"), ("GET", "/nowhere")]:
        status, headers, body = raw(worker, method, path, {"Authorization": authorization})
        assert status == 403, (authorization, method, path, body)
        assert json.loads(body)["error"] == "forbidden" and "WWW-Authenticate" not in headers
    assert "intruder" not in worker.client.list() and "echo" in worker.client.list()


def test_a_client_with_a_wrong_token_gets_403(worker):
    with pytest.raises(sprout.SproutError) as err:
        sprout.Client(worker.url, token="f" * 64).list()
    assert err.value.status == 403 and err.value.code == "forbidden"


def test_run_and_status_need_no_token(worker):
    status, _, body = raw(worker, "POST", "/run/echo", {"Content-Type": "application/json"}, b'{"hi": 1}')
    assert status == 200 and json.loads(body) == {"hi": 1}
    status, _, body = raw(worker, "GET", "/run/hello/ada")
    assert status == 200 and b"ada" in body
    status, _, body = raw(worker, "POST", "/run/echo", {"Authorization": "Bearer wrong"}, b"2")
    assert status == 200 and body == b"2"
    status, _, body = raw(worker, "GET", "/status")
    assert status == 200 and body == b"ready\n"
    status, _, body = raw(worker, "GET", "/run/nosuchlambda")
    assert status == 404 and json.loads(body)["error"] == "lambda_not_found"


def test_a_lambda_never_sees_the_worker_token(worker):
    worker.deploy_source("shows-authorization", SHOW_AUTHORIZATION)
    status, _, body = raw(worker, "GET", "/run/shows-authorization/", {"Authorization": f"Bearer {token_of(worker)}"})
    assert status == 200 and body == b"(none)"
    status, _, body = raw(worker, "GET", "/run/shows-authorization/", {"Authorization": "Bearer the-app-s-own"})
    assert status == 200 and body == b"Bearer the-app-s-own"
    assert worker.client.request("GET", "shows-authorization").body == b"(none)"  # the client sends none to /run


def test_refusals_are_counted_as_errors(worker):
    raw(worker, "GET", "/stats")
    raw(worker, "GET", "/stats", {"Authorization": "Bearer wrong"})
    errors = worker.client.stats()["errors"]
    assert errors["unauthorized"] >= 1 and errors["forbidden"] >= 1
    metrics = worker.client.metrics()
    assert 'sprout_errors_total{kind="unauthorized"}' in metrics and 'sprout_errors_total{kind="forbidden"}' in metrics


def test_the_running_worker_publishes_its_token_for_clients(worker):
    published = discovery_file(worker)
    assert published.read_text().strip() == token_of(worker)
    assert mode(published) == 0o600 and mode(DISCOVERY) == 0o700
    client = sprout.Client(worker.url)  # no token given: discovered
    assert client.token() == token_of(worker)
    client.deploy(str(EXAMPLES / "echo"), name="found")
    assert "found" in client.list() and client.get("found")["name"] == "found"
    assert client.run("found", [1]) == [1]
    assert client.stats()["invocations"] >= 1
    assert "sprout_invocations_total" in client.metrics()
    assert isinstance(client.packages(), list)
    assert client.delete("found") == {"deleted": "found"}
    localhost = sprout.Client(f"http://localhost:{worker.port}")
    assert localhost.token() == token_of(worker) and "echo" in localhost.list()


def test_a_token_given_explicitly_or_in_the_environment(worker, monkeypatch, tmp_path):
    monkeypatch.setattr(sprout.client, "DISCOVERY_DIR", str(tmp_path / "nothing-here"))
    monkeypatch.delenv("SPROUT_TOKEN", raising=False)
    with pytest.raises(sprout.SproutError) as err:
        sprout.Client(worker.url).list()
    assert err.value.status == 401 and err.value.code == "unauthorized"
    explicit = sprout.Client(worker.url, token=token_of(worker))
    explicit.deploy(str(EXAMPLES / "echo"), name="explicit")
    assert "explicit" in explicit.list() and explicit.stats()["backend"] == "sock"
    monkeypatch.setenv("SPROUT_TOKEN", token_of(worker))
    assert sprout.Client(worker.url).delete("explicit") == {"deleted": "explicit"}
    # The argument comes before the environment.
    with pytest.raises(sprout.SproutError) as err:
        sprout.Client(worker.url, token="0" * 64).list()
    assert err.value.status == 403


def test_the_command_line_finds_or_takes_the_token(worker):
    def sprout_cli(*args, env=None):
        return subprocess.run([str(SPROUT), *map(str, args)], check=False, capture_output=True, text=True, timeout=120,
                              env={k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None})

    echo = EXAMPLES / "echo"
    out = sprout_cli("deploy", echo, "--name", "cli-found", "--url", worker.url, env={"SPROUT_TOKEN": None})
    assert out.returncode == 0 and json.loads(out.stdout)["name"] == "cli-found", out.stderr
    out = sprout_cli("deploy", echo, "--name", "cli-wrong", "--url", worker.url, "--token", "0" * 64)
    assert out.returncode == 1 and "403 forbidden" in out.stderr
    out = sprout_cli("deploy", echo, "--name", "cli-env", "--url", worker.url, env={"SPROUT_TOKEN": token_of(worker)})
    assert out.returncode == 0, out.stderr
    out = sprout_cli("invoke", "cli-env", "[3]", "--url", worker.url)
    assert out.returncode == 0 and json.loads(out.stdout) == [3]
    out = sprout_cli("zygotes", worker.dir, env={"SPROUT_TOKEN": None})
    assert out.returncode == 0 and "import cache" in out.stdout, out.stderr
    assert {"cli-found", "cli-env"} <= set(worker.client.list()) and "cli-wrong" not in worker.client.list()


def test_auth_false_opens_everything(make_worker):
    w = make_worker(worker={"auth": False})
    status, _, body = raw(w, "POST", "/registry/open", body=targz({"f.py": "def f(event):\n    return 'open'\n"}))
    assert status == 201, body
    for path in ("/registry", "/registry/open", "/stats", "/metrics", "/packages", "/pid"):
        status, _, body = raw(w, "GET", path)
        assert status == 200, (path, body)
    assert raw(w, "GET", "/nowhere")[0] == 404
    assert raw(w, "GET", "/stats", {"Authorization": "Bearer wrong"})[0] == 200
    assert raw(w, "DELETE", "/registry/open")[0] == 200
    assert not discovery_file(w).exists()


def test_the_token_is_private_made_once_and_kept_across_restarts(make_worker):
    w = make_worker()
    path = w.dir / "api-token"
    token = path.read_text()
    assert mode(path) == 0o600 and len(token) == 64 and int(token, 16) >= 0
    assert discovery_file(w).read_text() == token
    w.stop()
    assert not discovery_file(w).exists(), "a clean stop removes the published token"
    w.sprout("worker", "init", w.dir)
    w.start()
    assert path.read_text() == token and mode(path) == 0o600
    assert discovery_file(w).read_text() == token
    assert isinstance(w.client.list(), list)


def test_init_makes_the_token(tmp_path, sprout_bin):
    d = tmp_path / "w"
    out = subprocess.run([str(sprout_bin), "worker", "init", str(d)], check=False, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "api-token" in out.stderr, out.stderr
    token = (d / "api-token").read_text()
    assert mode(d / "api-token") == 0o600 and len(token) == 64
    again = subprocess.run([str(sprout_bin), "worker", "init", str(d)], check=False, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and (d / "api-token").read_text() == token


def test_cleanup_after_kill_9_removes_the_stale_published_token(make_worker):
    w = make_worker()
    token = token_of(w)
    w.process.send_signal(signal.SIGKILL)
    w.process.wait()
    assert discovery_file(w).read_text() == token, "kill -9 leaves it"
    w.sprout("worker", "cleanup", w.dir)
    assert not discovery_file(w).exists()
