"""A small WSGI site for the app port's tests (standard library only): it reports what it
was given, sets cookies, redirects, fails, sleeps, and answers under /static too, so a test
can tell who answered."""

import hashlib
import json
import time

SEEN = ["REQUEST_METHOD", "SCRIPT_NAME", "PATH_INFO", "QUERY_STRING", "CONTENT_TYPE", "CONTENT_LENGTH",
        "HTTP_HOST", "HTTP_COOKIE", "HTTP_X_CUSTOM", "SERVER_NAME", "SERVER_PORT"]


def app(environ, start_response):
    path = environ["PATH_INFO"]
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    if path == "/login":
        start_response("303 See Other", [
            ("Location", "/home?welcome=1"),
            ("Set-Cookie", "session=abc123; Path=/; HttpOnly"),
            ("Set-Cookie", "theme=dark; Path=/; Max-Age=3600"),
            ("Content-Type", "text/plain"),
        ])
        return [b"see other\n"]
    if path == "/away":
        start_response("302 Found", [("Location", "http://elsewhere.example/x?y=1#z")])
        return [b""]
    if path == "/boom":
        raise RuntimeError("the page broke")
    if path == "/sleep":
        time.sleep(float(environ["QUERY_STRING"] or 1))
    if path == "/page":
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", "21")])
        return [] if environ["REQUEST_METHOD"] == "HEAD" else [b"<p>a page of text</p>"]
    seen = {key: environ.get(key) for key in SEEN}
    seen["body_sha256"] = hashlib.sha256(body).hexdigest()
    seen["body_length"] = len(body)
    start_response("200 OK", [("Content-Type", "application/json"), ("X-Answered-By", "lambda")])
    return [json.dumps(seen).encode()]
