"""Hello world as a bare ASGI callable (no framework): the ASGI side of the README's latency
comparison with wsgi-hello."""


async def app(scope, receive, send):
    if scope["type"] != "http":
        return  # no lifespan to speak of
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello\n"})
