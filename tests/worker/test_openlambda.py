"""OpenLambda parity: the lambdas of examples/openlambda, in OpenLambda's own format, deployed
to a real worker and checked the way OpenLambda's integration tests (its scripts/test.py)
check theirs: a Flask app's 418 with its own header, a method ol.yaml does not allow
answered with OpenLambda's words, POST bodies echoed, numpy 2.1 and 2.2 side by side, pandas,
a fork bomb bounded, the memory limit found, ol.yaml's environment, entry files and
reuse-sandbox, ASGI apps (FastAPI, Starlette, Quart), code updates seen at once, and 100
lambdas called once each. Packages come from the package index, as a user's would."""

import json
import time

import pytest

import sprout
from conftest import ROOT, Worker, free_port, targz

OPENLAMBDA = ROOT / "examples" / "openlambda"
MEMORY_MB, PIDS = 256, 32


@pytest.fixture(scope="module")
def ol(tmp_path_factory, sprout_bin):
    """A worker with OpenLambda's test limits (numpy's OpenBLAS threads need the processes),
    every example deployed, and an app port serving the FastAPI example."""
    app_port = free_port()
    w = Worker(tmp_path_factory.mktemp("openlambda"), {
        "limits": {"memory_mb": MEMORY_MB, "pids": PIDS},
        "packages": {"install_timeout_s": 600},
        "app": {"listen": f"127.0.0.1:{app_port}", "lambda": "fastapi-hello"},
    })
    w.app_url = ("127.0.0.1", app_port)
    w.start()
    # A first request waits for its packages from the index (numpy, pandas, flask, ... all
    # installing at once, beside the other test modules when they run in parallel): as long
    # as the installs may take, not the usual minute.
    w.client.timeout = 600
    for example in sorted(OPENLAMBDA.iterdir()):
        if example.is_dir():
            w.client.deploy(str(example))
    yield w
    w.stop()
    assert w.leftovers() == []


def http(address, method, path, body=b"", headers=None):
    """One request on its own connection: (status, headers, body)."""
    import http.client

    conn = http.client.HTTPConnection(*address, timeout=300)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_a_flask_app_owns_its_status_headers_and_body_and_ol_yaml_limits_methods(ol):
    for method in ("GET", "POST"):
        r = ol.client.request(method, "teapot")
        assert (r.status, r.headers["X-Teapot"], r.body) == (418, "yes", b"short and stout\n")
    r = ol.client.request("PUT", "teapot")
    assert r.status == 405
    assert r.body == b"HTTP method not allowed. Sent: PUT, Allowed: [GET POST]\n"
    assert r.headers["Allow"] == "GET, POST" and r.headers["Content-Type"].startswith("text/plain")


def test_post_bodies_are_echoed_byte_for_byte(ol):
    body = bytes(range(256)) * 1000
    r = ol.client.request("POST", "post-echo", body=body, headers={"Content-Type": "application/x-test"})
    assert (r.status, r.body, r.headers["Content-Type"]) == (200, body, "application/x-test")


def test_two_numpy_versions_side_by_side_and_pandas(ol):
    r = ol.client.run("numpy21", [1, 2])
    assert r["result"] == 3 and r["numpy-version"].startswith("2.1")
    r = ol.client.run("numpy22", [[1, 2], [3, 4]])
    assert r["result"] == 10 and r["numpy-version"].startswith("2.2")
    r = ol.client.run("numpy22", [[[1, 2], [3, 4]], [[1, 2], [3, 4]]])
    assert r["result"] == 20
    r = ol.client.run("pandas", [[0, 1, 2], [3, 4, 5]])
    assert r["result"] == 15 and tuple(map(int, r["numpy-version"].split(".")[:2])) >= (1, 22)


def test_a_fork_bomb_is_bounded_by_the_process_limit(ol):
    made = ol.client.run("fbomb", {"times": PIDS * 2})
    assert 1 <= made < PIDS


def test_the_memory_limit_is_found_where_it_was_set(ol):
    found = ol.client.run("max-mem", None)
    # The helper's own memory is in the same cgroup: the child gets a little less.
    assert 0.8 * MEMORY_MB <= found < MEMORY_MB, found


def test_ol_yaml_environment_is_set_before_import_and_written_to_dotenv(ol):
    r = ol.client.run("env-test", {})
    assert r["at_import"] == {"GREETING": "hello from ol.yaml", "DATABASE_URL": "postgresql://app:secret@db/app",
                              "DEBUG_MODE": "true", "WORKERS": "4", "QUOTED": 'say "hi"'}
    assert 'GREETING="hello from ol.yaml"' in r["dotenv"] and 'QUOTED="say \\"hi\\""' in r["dotenv"]


def test_environment_never_reaches_another_lambdas_sandbox_or_its_zygote(ol):
    ol.client.run("env-test", {})  # its sandbox exists, forked from the same Zygote
    leaked = ol.deploy_source("env-probe", "import os\ndef f(e):\n    return {k: v for k, v in os.environ.items() "
                              "if k in ('GREETING', 'DATABASE_URL', 'WORKERS')}\n")
    assert leaked["name"] == "env-probe"
    assert ol.client.run("env-probe", None) == {}


def test_an_entry_file_and_a_wsgi_entry_of_other_names(ol):
    r = ol.client.request("GET", "entry-file", "/info")
    assert r.status == 200
    assert json.loads(r.body) == {"entry_file": "main.py", "module": "main", "path": "/info"}
    assert ol.client.request("POST", "entry-file").status == 405


def test_an_entry_file_for_a_function_and_a_named_asgi_entry(ol):
    ol.client.upload("entry-function", targz({
        "ol.yaml": "environment:\n  OL_ENTRY_FILE: handler.py\n",
        "handler.py": "def f(event):\n    return {'module': __name__, 'event': event}\n",
    }))
    assert ol.client.run("entry-function", [1]) == {"module": "handler", "event": [1]}
    ol.client.upload("entry-asgi", targz({
        "ol.yaml": "environment:\n  OL_ENTRY_FILE: service.py\n  OL_ASGI_ENTRY: api\n",
        "service.py": (
            "def f(event):\n    return 'not me: OL_ASGI_ENTRY comes first'\n\n"
            "async def api(scope, receive, send):\n"
            "    if scope['type'] != 'http':\n        return\n"
            "    await send({'type': 'http.response.start', 'status': 200, 'headers': []})\n"
            "    await send({'type': 'http.response.body', 'body': scope['path'].encode()})\n"),
    }))
    r = ol.client.request("GET", "entry-asgi", "/x")
    assert (r.status, r.body) == (200, b"/run/entry-asgi/x")


def test_reuse_sandbox_false_gives_every_request_a_fresh_sandbox(ol):
    seen = set()
    for _ in range(3):
        r = ol.client.request("POST", "fresh-sandbox", body=b"null", headers={"Content-Type": "application/json"})
        assert (r.status, json.loads(r.body)) == (200, {"calls": 1})
        assert r.headers["X-Sprout-Start"] == "cold"
        seen.add(r.headers["X-Sprout-Sandbox"])
    assert len(seen) == 3


def test_a_fastapi_app_with_lifespan_json_status_headers_and_errors(ol):
    r = ol.client.request("GET", "fastapi-hello", "/hello/ada?shout=true")
    assert r.status == 200 and json.loads(r.body) == {"message": "HELLO, ADA", "startups": 1}
    r = ol.client.request("POST", "fastapi-hello", "/items", body=b'{"name": "tea", "price": 2.5}',
                          headers={"Content-Type": "application/json"})
    assert (r.status, r.headers["X-Item"], json.loads(r.body)) == (201, "tea", {"name": "tea", "price_with_tax": 3.0})
    r = ol.client.request("POST", "fastapi-hello", "/items", body=b'{"name": "tea"}', headers={"Content-Type": "application/json"})
    assert r.status == 422  # FastAPI's own validation answer
    with pytest.raises(sprout.SproutError) as failed:
        ol.client.request("GET", "fastapi-hello", "/boom")
    assert failed.value.status == 500 and failed.value.code == "handler_exception"
    assert "RuntimeError: the app failed on purpose" in failed.value.body["traceback"]
    # Startup ran once in this sandbox, not once per request.
    assert json.loads(ol.client.request("GET", "fastapi-hello", "/hello/x").body)["startups"] == 1


def test_an_asgi_app_on_the_app_port(ol):
    status, headers, body = http(ol.app_url, "GET", "/hello/app%20port")
    assert status == 200 and json.loads(body)["message"] == "hello, app port"
    status, _, body = http(ol.app_url, "GET", "/openapi.json")  # FastAPI's own route, root path ""
    assert status == 200 and json.loads(body)["paths"]["/hello/{name}"]


def test_a_starlette_app_streams_request_and_response_bodies(ol):
    body = b"x" * (200 * 1024)
    r = ol.client.request("POST", "starlette-stream", "/upload", body=body)
    assert r.status == 200 and json.loads(r.body) == {"chunks": 4, "bytes": len(body)}  # 64 KiB pieces
    r = ol.client.request("GET", "starlette-stream", "/words")
    assert (r.status, r.body, r.headers["X-Streamed"]) == (200, b"one\ntwo\nthree\n", "yes")


def test_a_quart_app(ol):
    r = ol.client.request("GET", "quart-hello")
    assert (r.status, r.body, r.headers["X-Framework"]) == (200, b"hello from quart\n", "quart")
    r = ol.client.request("POST", "quart-hello", "/echo", body=b'{"a": [1, 2]}', headers={"Content-Type": "application/json"})
    assert json.loads(r.body) == {"a": [1, 2]}


def test_bare_asgi_and_wsgi_hello_worlds(ol):
    for name in ("asgi-hello", "wsgi-hello"):
        r = ol.client.request("GET", name)
        assert (r.status, r.body) == (200, b"hello\n"), name


def test_code_updates_are_seen_by_the_next_request(ol):
    for version in range(3):
        ol.deploy_source("version", f"def f(event):\n    return {version}\n")
        assert ol.client.run("version", None) == version


def test_a_hundred_lambdas_called_once_each(ol):
    for pos in range(100):
        ol.deploy_source(f"L{pos}", f"def f(event):\n    global s\n    s = '*' * 10 * 1024**2\n    return {pos}\n")
    started = time.monotonic()
    for pos in range(100):
        assert ol.client.run(f"L{pos}", {}) == pos
    assert time.monotonic() - started < 120
    # With a hundred handlers alive as the sandbox user, an upload is still checked.
    assert ol.deploy_source("one-more", "def f(event):\n    return 'checked'\n")["name"] == "one-more"
    assert ol.client.run("one-more", None) == "checked"
    for pos in range(100):
        ol.client.delete(f"L{pos}")


# ---------------------------------------------------------------- upload checks


def test_a_malformed_ol_yaml_is_refused_with_its_line_and_nothing_is_replaced(ol):
    ol.deploy_source("guarded", "def f(e):\n    return 'v1'\n")
    bad = {
        "triggers:\n  http:\n    - method: GET\nenviroment:\n  A: b\n": (4, "unknown field `enviroment`"),
        "triggers:\n  http:\n    - method: \"GE T\"\n": (3, "is not an HTTP method"),
        "environment:\n  OL_ENTRY_FILE: app.js\n": (2, "must name a .py file"),
        "triggers: [\n": (1, "invalid type: sequence"),
    }
    for text, (line, reason) in bad.items():
        with pytest.raises(sprout.SproutError) as refused:
            ol.client.upload("guarded", targz({"f.py": "def f(e):\n    return 'v2'\n", "ol.yaml": text}))
        assert refused.value.status == 400 and refused.value.code == "invalid_lambda_config", text
        assert refused.value.body["line"] == line and reason in refused.value.message, refused.value.body
        assert refused.value.message.startswith(f"ol.yaml line {line}: ")
    assert ol.client.run("guarded", None) == "v1"


def test_the_entry_file_must_exist_and_the_error_names_it(ol):
    with pytest.raises(sprout.SproutError) as refused:
        ol.client.upload("no-entry", targz({"ol.yaml": "environment:\n  OL_ENTRY_FILE: main.py\n", "f.py": "x = 1\n"}))
    assert refused.value.code == "missing_handler" and "no main.py at its top level" in refused.value.message
    with pytest.raises(sprout.SproutError) as refused:
        ol.client.upload("no-entry", targz({"app.py": "x = 1\n"}))
    assert refused.value.code == "missing_handler" and "no f.py" in refused.value.message
    with pytest.raises(sprout.SproutError) as refused:
        ol.client.upload("no-entry", targz({"ol.yaml": "environment:\n  OL_ENTRY_FILE: main.py\n", "main.py": "def f(:\n"}))
    assert refused.value.code == "syntax_error" and refused.value.message.startswith("syntax error in main.py line 1")


def test_a_dotenv_in_the_archive_is_the_environment(ol):
    ol.client.upload("dotenv", targz({"f.py": "import os\ndef f(e):\n    return os.environ.get('COLOR')\n",
                                      ".env": "# from the archive\nCOLOR=teal\n"}))
    assert ol.client.run("dotenv", None) == "teal"


def test_the_worker_keeps_a_lambdas_configuration_across_restarts(tmp_path, sprout_bin):
    w = Worker(tmp_path / "w", {})
    w.start()
    try:
        w.client.deploy(str(OPENLAMBDA / "entry-file"))
        w.stop()
        w.start()
        assert w.client.request("PUT", "entry-file").status == 405
        assert json.loads(w.client.request("GET", "entry-file").body)["entry_file"] == "main.py"
        assert w.client.get("entry-file")["config"]["http_methods"] == ["GET"]
    finally:
        w.stop()
    assert w.leftovers() == []
