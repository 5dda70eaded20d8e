"""The in-sandbox ASGI server (python/sprout/runtime/asgi.py) on its own, on the host's
Python, against hand-written ASGI apps: the lifespan protocol (complete, failed, absent),
the HTTP scope, the request body in 64 KiB events, the response from its start and body
events, and every way an app can get the protocol wrong."""

import importlib.util

import pytest

from conftest import ROOT

spec = importlib.util.spec_from_file_location("sprout_asgi", ROOT / "python" / "sprout" / "runtime" / "asgi.py")
asgi = importlib.util.module_from_spec(spec)
spec.loader.exec_module(asgi)

REQUEST = {"method": "POST", "script_name": "/run/app", "path": "/a%20b/c", "query": "q=1&r=%C3%A9",
           "headers": [["Host", "example.org:8080"], ["X-Two", "1"], ["X-Two", "2"]], "protocol": "HTTP/1.1",
           "remote_addr": "10.0.0.7"}


def responder(status=200, headers=(), chunks=(b"ok",)):
    async def send_response(send):
        await send({"type": "http.response.start", "status": status, "headers": list(headers)})
        for i, chunk in enumerate(chunks):
            await send({"type": "http.response.body", "body": chunk, "more_body": i < len(chunks) - 1})
    return send_response


def test_the_scope_says_what_the_request_was():
    seen = {}

    async def app(scope, receive, send):
        seen.update(scope)
        await responder()(send)

    server = asgi.Server(app)
    header, body = server.invoke(REQUEST, b"")
    assert (header, body) == ({"status": 200, "headers": []}, b"ok")
    assert seen["type"] == "http" and seen["asgi"]["version"] == "3.0"
    # The path includes the root path (where the app is mounted), as the ASGI spec has it.
    assert (seen["method"], seen["path"], seen["raw_path"], seen["query_string"]) == ("POST", "/run/app/a b/c", b"/run/app/a%20b/c",
                                                                                      b"q=1&r=%C3%A9")
    assert (seen["root_path"], seen["http_version"], seen["scheme"]) == ("/run/app", "1.1", "http")
    assert seen["headers"] == [(b"host", b"example.org:8080"), (b"x-two", b"1"), (b"x-two", b"2")]
    assert seen["server"] == ("example.org", 8080) and seen["client"] == ("10.0.0.7", 0)


def test_the_body_arrives_in_chunks_then_the_connection_ends():
    events = []

    async def app(scope, receive, send):
        while True:
            event = await receive()
            events.append((event["type"], len(event.get("body", b"")), event.get("more_body")))
            if not event.get("more_body"):
                break
        await responder(chunks=(b"a", b"b", b""))(send)
        events.append(((await receive())["type"], 0, None))

    body = b"x" * (150 * 1024)
    header, out = asgi.Server(app).invoke(REQUEST, body)
    assert out == b"ab" and header["status"] == 200
    assert events == [("http.request", 65536, True), ("http.request", 65536, True), ("http.request", 22528, False),
                      ("http.disconnect", 0, None)]


def test_an_empty_body_is_one_event_and_headers_come_back_as_text():
    async def app(scope, receive, send):
        assert await receive() == {"type": "http.request", "body": b"", "more_body": False}
        await responder(201, [(b"X-A", b"b"), (b"Set-Cookie", b"s=1")])(send)

    header, _ = asgi.Server(app).invoke(REQUEST, b"")
    assert header == {"status": 201, "headers": [["X-A", "b"], ["Set-Cookie", "s=1"]]}


@pytest.mark.parametrize("app_body, code, words", [
    ("raise ValueError('nope')", "handler_exception", "ValueError: nope"),
    ("await send({'type': 'http.response.body', 'body': b'x'})", "handler_exception", "before http.response.start"),
    ("pass", "invalid_result", "without starting a response"),
])
def test_an_app_that_fails_or_breaks_the_protocol_is_an_error_with_its_traceback(app_body, code, words):
    namespace = {}
    exec(f"async def app(scope, receive, send):\n    {app_body}\n", namespace)
    header, body = asgi.Server(namespace["app"]).invoke(REQUEST, b"")
    assert header["error"] == code and words in header["message"] and body == b""
    if code == "handler_exception":
        assert "Traceback" in header["traceback"]


def test_an_exception_after_the_response_started_is_still_an_error():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200})
        raise RuntimeError("half way")

    header, _ = asgi.Server(app).invoke(REQUEST, b"")
    assert header["error"] == "handler_exception" and "half way" in header["message"]


def lifespan_app(log, fail=None):
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                event = await receive()
                log.append(event["type"])
                if event["type"] == "lifespan.startup":
                    if fail:
                        await send({"type": "lifespan.startup.failed", "message": fail})
                        return
                    scope["state"]["db"] = "connected"
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        log.append(("request", scope["state"].get("db")))
        await responder()(send)
    return app


def test_lifespan_startup_runs_once_its_state_reaches_requests_and_shutdown_runs():
    log = []
    server = asgi.Server(lifespan_app(log))
    server.startup()
    for _ in range(2):
        assert server.invoke(REQUEST, b"")[0]["status"] == 200
    server.shutdown()
    assert log == ["lifespan.startup", ("request", "connected"), ("request", "connected"), "lifespan.shutdown"]


def test_a_failed_startup_is_the_lambdas_load_error():
    server = asgi.Server(lifespan_app([], fail="no database"))
    with pytest.raises(asgi.LifespanFailed, match="no database"):
        server.startup()


def test_an_app_without_lifespan_support_is_served_without_it(capsys):
    async def app(scope, receive, send):
        assert scope["type"] == "http", "lifespan not supported"
        await responder()(send)

    server = asgi.Server(app)
    server.startup()
    assert server.invoke(REQUEST, b"")[0]["status"] == 200
    server.shutdown()  # nothing to shut down
    assert "no lifespan support" in capsys.readouterr().err


def test_an_app_that_returns_on_the_lifespan_scope_is_served_without_it(capsys):
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await responder()(send)

    server = asgi.Server(app)
    server.startup()  # does not wait for a startup.complete that never comes
    assert server.invoke(REQUEST, b"")[0]["status"] == 200
    assert "no lifespan support (it returned)" in capsys.readouterr().err
