"""The app port against a real worker: one WSGI lambda served as a web site (whole paths,
no script name, headers, cookies and redirects passed through, keep-alive, the worker's own
JSON errors), static prefixes served from host directories (types, dates, 304, HEAD, 404,
no way out of the directory), metrics, and configuration mistakes refused at start."""

import hashlib
import http.client
import json
import os
import socket
import subprocess
import threading
import time

import pytest

from conftest import Worker, free_port
from toml_sections import to_toml

CSS = "body { color: #333; }\n"
SECRET = "the host's secret\n"
BIG = bytes(range(256)) * (5 * 4096)  # 5 MiB


def app_settings(port, lambda_name="webapp", static=None):
    return {"listen": f"127.0.0.1:{port}", "lambda": lambda_name, "static": static or {}}


@pytest.fixture(scope="module")
def site(tmp_path_factory, sprout_bin):
    """A worker whose app port serves the `webapp` lambda, with /static/ from a directory
    that holds links pointing out of it (and a secret beside it)."""
    root = tmp_path_factory.mktemp("site")
    static = root / "static"
    (static / "css").mkdir(parents=True)
    (static / "css" / "site.css").write_text(CSS)
    (static / "empty-dir").mkdir()
    (root / "secret.txt").write_text(SECRET)
    os.symlink(root / "secret.txt", static / "absolute-link")
    os.symlink("../secret.txt", static / "relative-link")
    os.symlink("/etc", static / "etc-link")
    os.symlink("css/site.css", static / "inner-link.css")
    (static / ".secret").write_text(SECRET)  # hidden files are never served
    (static / "css" / ".hidden").write_text(SECRET)
    (static / "big.bin").write_bytes(BIG)  # past the inline size: streamed
    port = free_port()
    w = Worker(root / "worker", {"app": app_settings(port, static={"/static/": str(static)})})
    w.app_port = port
    w.start()
    w.deploy_test_lambda("webapp")
    yield w
    w.stop()
    assert w.leftovers() == [], f"worker left {w.leftovers()}"


def call(port, method, path, body=None, headers=None, connection=None):
    """One request (on `connection` when given); returns the response and its body."""
    c = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request(method, path, body=body, headers=headers or {})
    response = c.getresponse()
    return response, response.read()


def test_the_app_sees_the_whole_path_no_script_name_and_its_host(site):
    r, body = call(site.app_port, "GET", "/events/a%20b?x=1&y=%C3%A9", headers={"Host": "olio.example:8080", "X-Custom": "yes"})
    assert r.status == 200 and r.getheader("X-Answered-By") == "lambda"
    env = json.loads(body)
    assert env["SCRIPT_NAME"] == "" and env["PATH_INFO"] == "/events/a b"
    assert env["QUERY_STRING"] == "x=1&y=%C3%A9" and env["REQUEST_METHOD"] == "GET"
    assert env["HTTP_HOST"] == "olio.example:8080" and env["HTTP_X_CUSTOM"] == "yes"
    assert env["SERVER_NAME"] == "olio.example" and env["SERVER_PORT"] == "8080"
    # the same lambda through the API keeps OpenLambda's paths
    via_api = site.client.request("GET", "webapp", "/events/a%20b")
    assert via_api.json()["SCRIPT_NAME"] == "/run/webapp" and via_api.json()["PATH_INFO"] == "/events/a b"
    root = json.loads(call(site.app_port, "GET", "/")[1])
    assert root["PATH_INFO"] == "/" and root["SCRIPT_NAME"] == ""


def test_methods_and_bodies_pass_through(site):
    payload = os.urandom(1 << 20)
    boundary = "----sprout-test"
    r, body = call(site.app_port, "POST", "/users", payload, {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    env = json.loads(body)
    assert r.status == 200 and env["REQUEST_METHOD"] == "POST"
    assert env["body_length"] == len(payload) and env["body_sha256"] == hashlib.sha256(payload).hexdigest()
    assert env["CONTENT_TYPE"] == f"multipart/form-data; boundary={boundary}"
    for method in ("PUT", "DELETE", "PATCH"):
        assert json.loads(call(site.app_port, method, "/x", b"1")[1])["REQUEST_METHOD"] == method


def test_cookies_and_redirects_pass_through_untouched(site):
    r, _ = call(site.app_port, "POST", "/login", b"user=ada")
    assert r.status == 303
    assert r.getheader("Location") == "/home?welcome=1"
    assert r.msg.get_all("Set-Cookie") == ["session=abc123; Path=/; HttpOnly", "theme=dark; Path=/; Max-Age=3600"]
    r, body = call(site.app_port, "GET", "/home?welcome=1", headers={"Cookie": "session=abc123; theme=dark"})
    assert json.loads(body)["HTTP_COOKIE"] == "session=abc123; theme=dark"
    r, _ = call(site.app_port, "GET", "/away")
    assert r.status == 302 and r.getheader("Location") == "http://elsewhere.example/x?y=1#z"


def test_head_keeps_the_length_of_the_page(site):
    r, body = call(site.app_port, "HEAD", "/page")
    assert r.status == 200 and body == b"" and r.getheader("Content-Length") == "21"
    r, body = call(site.app_port, "GET", "/page")
    assert body == b"<p>a page of text</p>" and r.getheader("Content-Length") == "21"


def test_static_files_have_type_length_dates_and_304(site):
    r, body = call(site.app_port, "GET", "/static/css/site.css")
    assert r.status == 200 and body.decode() == CSS and r.getheader("X-Answered-By") is None
    assert r.getheader("Content-Type").startswith("text/css")
    assert r.getheader("Content-Length") == str(len(CSS))
    modified = r.getheader("Last-Modified")
    assert modified and modified.endswith("GMT")
    r, body = call(site.app_port, "GET", "/static/css/site.css", headers={"If-Modified-Since": modified})
    assert r.status == 304 and body == b"" and r.getheader("Last-Modified") == modified
    r, body = call(site.app_port, "GET", "/static/css/site.css", headers={"If-Modified-Since": "Mon, 01 Jan 2001 00:00:00 GMT"})
    assert r.status == 200 and body.decode() == CSS
    r, body = call(site.app_port, "HEAD", "/static/css/site.css")
    assert r.status == 200 and body == b"" and r.getheader("Content-Length") == str(len(CSS))
    assert r.getheader("Content-Type").startswith("text/css") and r.getheader("Last-Modified") == modified
    r, body = call(site.app_port, "GET", "/static/inner-link.css")  # a link that stays inside
    assert r.status == 200 and body.decode() == CSS


def test_large_static_files_stream_whole_and_by_range(site):
    r, body = call(site.app_port, "GET", "/static/big.bin")
    assert r.status == 200 and r.getheader("Content-Length") == str(len(BIG)) and body == BIG
    r, body = call(site.app_port, "GET", "/static/big.bin", headers={"Range": "bytes=10-19"})
    assert r.status == 206 and body == BIG[10:20]


def test_static_misses_directories_and_other_methods(site):
    for path in ("/static/css/missing.css", "/static/css/", "/static/css", "/static/empty-dir/", "/static/"):
        r, body = call(site.app_port, "GET", path)
        assert r.status == 404 and json.loads(body)["error"] == "not_found", path
    r, body = call(site.app_port, "POST", "/static/css/site.css", b"x")
    assert r.status == 405 and r.getheader("Allow") == "GET, HEAD"
    # a path outside every prefix is the lambda's, even one that merely begins like one
    r, body = call(site.app_port, "GET", "/static")
    assert r.getheader("X-Answered-By") == "lambda" and json.loads(body)["PATH_INFO"] == "/static"


@pytest.mark.parametrize("path", [
    "/static/../secret.txt",
    "/static/%2e%2e/secret.txt",
    "/static/%2E%2E%2Fsecret.txt",
    "/static/..%2fsecret.txt",
    "/static/css/../../secret.txt",
    "/static/absolute-link",
    "/static/relative-link",
    "/static/etc-link/hostname",
    "/static/%2fetc%2fhostname",
    "/static/.secret",
    "/static/%2esecret",
    "/static/css/.hidden",
])
def test_nothing_outside_the_static_directory_is_served(site, path):
    r, body = call(site.app_port, "GET", path)
    assert r.status == 404, (path, r.status)
    assert SECRET.encode() not in body and open("/etc/hostname", "rb").read() not in body


def test_connections_are_kept_alive(site):
    c = http.client.HTTPConnection("127.0.0.1", site.app_port, timeout=60)
    call(site.app_port, "GET", "/first", connection=c)
    sock = c.sock
    for method, path in [("GET", "/static/css/site.css"), ("GET", "/static/nothing"), ("POST", "/form"),
                         ("GET", "/boom"), ("HEAD", "/page"), ("GET", "/second")]:
        r, _ = call(site.app_port, method, path, b"" if method == "POST" else None, connection=c)
        assert r.version == 11 and not r.will_close, (method, path)
        assert c.sock is sock, f"{method} {path} closed the connection"
    c.close()


def test_worker_errors_keep_their_json(site):
    r, body = call(site.app_port, "GET", "/boom")
    error = json.loads(body)
    assert r.status == 500 and error["error"] == "handler_exception" and error["lambda"] == "webapp"
    assert "the page broke" in error["traceback"]


def test_static_hits_and_invocations_are_counted(site):
    before = site.client.stats()
    for _ in range(3):
        call(site.app_port, "GET", "/static/css/site.css")
    call(site.app_port, "GET", "/static/nothing-here")
    call(site.app_port, "GET", "/counted")
    after = site.client.stats()
    static_before = before["static"].get("/static/", {})
    assert after["static"]["/static/"]["200"] == static_before.get("200", 0) + 3
    assert after["static"]["/static/"]["404"] == static_before.get("404", 0) + 1
    assert after["invocations"] == before["invocations"] + 1  # the lambda's request only
    metrics = site.client._call("GET", "/metrics").body.decode()
    assert f'sprout_static_requests_total{{prefix="/static/",status="200"}} {after["static"]["/static/"]["200"]}' in metrics
    assert 'sprout_invocations_total{lambda="webapp",start="warm",outcome="ok"}' in metrics


def listening_ports(pid):
    """TCP ports process `pid` listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_no_app_port_unless_listen_is_set(make_worker, site):
    plain = make_worker()
    assert listening_ports(plain.process.pid) == {plain.port}
    assert listening_ports(site.process.pid) == {site.port, site.app_port}


def test_missing_lambda_timeouts_and_full_queues_answer_as_the_api_does(make_worker):
    port = free_port()
    w = make_worker(app=app_settings(port), limits={"timeout_ms": 2000},
                    instances={"max_per_lambda": 1, "queue_depth": 0})
    r, body = call(port, "GET", "/")
    assert r.status == 404 and json.loads(body)["error"] == "lambda_not_found"
    w.deploy_test_lambda("webapp")
    r, body = call(port, "GET", "/sleep?10")
    assert r.status == 504 and json.loads(body)["error"] == "timeout"
    slow = threading.Thread(target=call, args=(port, "GET", "/sleep?1.5"))
    slow.start()
    deadline = time.time() + 10
    while w.client.stats()["sandboxes"]["busy"] < 1 and time.time() < deadline:
        time.sleep(0.02)
    r, body = call(port, "GET", "/")
    slow.join()
    assert r.status == 429 and json.loads(body)["error"] == "queue_full"
    errors = w.client.stats()["errors"]
    assert errors["lambda_not_found"] == 1 and errors["timeout"] == 1 and errors["queue_full"] == 1


def test_bad_app_settings_stop_the_worker_naming_the_key(tmp_path, sprout_bin):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    cases = [
        ({"listen": "nowhere", "lambda": "webapp"}, "app.listen"),
        ({"listen": "127.0.0.1:{worker}", "lambda": "webapp"}, "worker.listen"),
        ({"listen": "127.0.0.1:{free}", "static": {"/s/": str(tmp_path)}}, "app.static needs app.lambda"),
        ({"listen": "127.0.0.1:{free}", "sites": {"a b": {"lambda": "webapp"}}}, 'app.sites."a b"'),
        ({"listen": "127.0.0.1:{free}", "sites": {"a.example": {"lambda": "webapp", "static": {"/s/": str(tmp_path / "none")}}}},
         'app.sites."a.example"'),
        ({"listen": "127.0.0.1:{free}", "lambda": "no/slashes"}, "app.lambda"),
        ({"lambda": "webapp"}, "app.listen"),
        ({"listen": "127.0.0.1:{free}", "lambda": "webapp", "static": {"static": str(tmp_path)}}, 'app.static."static"'),
        ({"listen": "127.0.0.1:{free}", "lambda": "webapp", "static": {"/s/": str(tmp_path / "none")}}, 'app.static."/s/"'),
        ({"listen": "127.0.0.1:{free}", "lambda": "webapp", "static": {"/s/": os.devnull}}, 'app.static."/s/"'),
        ({"listen": f"127.0.0.1:{taken}", "lambda": "webapp"}, "app.listen"),
    ]
    for i, (app, key) in enumerate(cases):
        w = Worker(tmp_path / f"w{i}", {})
        app = {k: v.format(worker=w.port, free=free_port()) if isinstance(v, str) else v for k, v in app.items()}
        (w.dir / "config.toml").write_text(to_toml({"worker": {"listen": f"127.0.0.1:{w.port}", "name": f"t{w.port}"}, "app": app}))
        out = subprocess.run([str(sprout_bin), "worker", "up", str(w.dir)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 1 and key in out.stderr, (app, out.stderr)
        assert w.leftovers() == []
    busy.close()
