"""Hello world as a bare WSGI callable: the WSGI side of the README's latency comparison."""


def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello\n"]
