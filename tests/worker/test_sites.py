"""Sites by host name on the app port: `[app.sites]` and the admin API's `/sites` map each
host to a lambda (and its static prefixes); an unknown host goes to `[app] lambda`, or is 404
`site_not_found`; sites added through the API survive a restart; configured ones cannot be
changed through it."""

import http.client
import json

import pytest

import sprout
from conftest import Worker, free_port, targz

SITE = """import json


def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps({{"site": {name!r}, "host": environ.get("HTTP_HOST"), "path": environ["PATH_INFO"]}}).encode()]
"""


def get(port, path, host):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", path, headers={"Host": host} if host is not None else {})
    r = c.getresponse()
    return r.status, r.read()


def deploy_sites(w, *names):
    for name in names:
        w.client.upload(name, targz({"f.py": SITE.format(name=name)}))


@pytest.fixture
def fleet_port(tmp_path):
    static = tmp_path / "a-static"
    static.mkdir()
    (static / "logo.txt").write_text("site a's logo\n")
    port = free_port()
    w = Worker(tmp_path / "w", {"app": {"listen": f"127.0.0.1:{port}", "sites": {
        "a.example": {"lambda": "site-a", "static": {"/static/": str(static)}},
        "b.example": {"lambda": "site-b"},
    }}})
    w.app_port = port
    w.start()
    deploy_sites(w, "site-a", "site-b", "site-c")
    yield w
    w.stop()
    assert w.leftovers() == []


def test_each_host_gets_its_own_site_and_static_files(fleet_port):
    port = fleet_port.app_port
    status, body = get(port, "/events/1", "A.example:8080")
    assert status == 200 and json.loads(body) == {"site": "site-a", "host": "A.example:8080", "path": "/events/1"}
    assert json.loads(get(port, "/", "b.example")[1])["site"] == "site-b"
    assert get(port, "/static/logo.txt", "a.example") == (200, b"site a's logo\n")
    # b has no static prefix: its lambda gets the path
    assert json.loads(get(port, "/static/logo.txt", "b.example")[1])["path"] == "/static/logo.txt"


def test_an_unknown_host_is_404_site_not_found(fleet_port):
    status, body = get(fleet_port.app_port, "/", "c.example")
    assert status == 404 and json.loads(body)["error"] == "site_not_found" and "c.example" in json.loads(body)["message"]


def test_the_admin_api_adds_replaces_and_removes_sites_and_they_survive_a_restart(fleet_port):
    w, port = fleet_port, fleet_port.app_port
    assert w.client.put_site("c.example", "site-c")["site"]["lambda"] == "site-c"
    assert json.loads(get(port, "/", "c.example")[1])["site"] == "site-c"
    w.client.put_site("c.example", "site-b")  # replaced
    assert json.loads(get(port, "/", "c.example")[1])["site"] == "site-b"
    listed = w.client.sites()
    assert listed["c.example"] == {"site": {"lambda": "site-b"}, "source": "api"}
    assert listed["a.example"]["source"] == "config"
    w.stop()
    w.start()
    assert json.loads(get(port, "/", "c.example")[1])["site"] == "site-b"
    assert w.client.delete_site("c.example") == {"deleted": "c.example"}
    assert get(port, "/", "c.example")[0] == 404
    with pytest.raises(sprout.SproutError) as gone:
        w.client.delete_site("c.example")
    assert gone.value.status == 404 and gone.value.code == "site_not_found"


def test_bad_sites_are_refused_and_configured_ones_are_not_the_apis(fleet_port):
    w = fleet_port
    for host, lambda_name, static, words in [
        ("a.example", "site-c", None, "config.toml"),
        ("bad host", "site-c", None, "not a host name"),
        ("d.example", "not a lambda", None, "not a lambda name"),
        ("d.example", "site-c", {"/static/": "relative/dir"}, "absolute"),
        ("d.example", "site-c", {"/static/": "/nonexistent-dir"}, "No such file"),
    ]:
        with pytest.raises(sprout.SproutError) as refused:
            w.client.put_site(host, lambda_name, static)
        assert refused.value.status == 400 and refused.value.code == "invalid_request" and words in refused.value.message
    assert json.loads(get(w.app_port, "/", "a.example")[1])["site"] == "site-a"


def test_the_default_site_serves_every_other_host(tmp_path):
    port = free_port()
    w = Worker(tmp_path / "w", {"app": {"listen": f"127.0.0.1:{port}", "lambda": "site-a", "sites": {"b.example": {"lambda": "site-b"}}}})
    w.start()
    try:
        deploy_sites(w, "site-a", "site-b")
        assert json.loads(get(port, "/", "anything.example")[1])["site"] == "site-a"
        assert json.loads(get(port, "/", "b.example")[1])["site"] == "site-b"
        assert w.client.sites()["*"]["site"]["lambda"] == "site-a"
    finally:
        w.stop()
    assert w.leftovers() == []


def test_without_an_app_port_the_sites_api_says_so(worker):
    with pytest.raises(sprout.SproutError) as missing:
        worker.client.sites()
    assert missing.value.status == 404 and "no app port" in missing.value.message
