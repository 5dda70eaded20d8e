"""A WSGI application as one lambda: GET /run/hello/ and /run/hello/<name>."""

import json


def app(environ, start_response):
    path = environ["PATH_INFO"].strip("/")
    if environ["REQUEST_METHOD"] == "POST":
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length)
        start_response("200 OK", [("Content-Type", "application/json")])
        return [json.dumps({"received": body.decode(errors="replace")}).encode()]
    if path and not path.isidentifier():
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"no such page\n"]
    start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
    return [f"<h1>Hello, {path or 'world'}!</h1>\n".encode()]
