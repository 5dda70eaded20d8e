"""Serving an ASGI application (FastAPI, Starlette, Quart...) in a Sprout sandbox: one request
frame from the worker becomes one ASGI HTTP connection, and the events the app sends become
one reply frame.

Loaded by the helper (by path, beside it in /opt/sprout) only for a lambda whose entry is an
ASGI callable; standard library only. The event loop is made after the fork, in the
handler's own process (a loop holds descriptors that must not be shared with the Zygote),
and runs only while a request or the lifespan protocol needs it: between requests the app's
background tasks wait, as the sandbox itself does when it is paused.

- Lifespan (ASGI lifespan protocol 2.0): startup runs once per sandbox, before the sandbox
  says it is ready; a failed startup is the lambda's load error. An app that does not speak
  the protocol (it raises on the lifespan scope, or returns) is served without it, as uvicorn
  does.
  Shutdown runs when the worker lets the sandbox go, bounded by a few seconds.
- HTTP (ASGI HTTP 2.3): the request body is streamed to the app in chunks; the response is
  collected from `http.response.start` and `http.response.body` events until `more_body` is
  false. An exception before the response is complete is a 500 with its traceback; an app
  that returns without starting a response is an invalid result.
"""

import asyncio
import sys
import traceback
from urllib.parse import unquote_to_bytes

CHUNK = 64 * 1024  # bytes of the request body per http.request event
SHUTDOWN_SECONDS = 5
ASGI = {"version": "3.0", "spec_version": "2.3"}


class LifespanFailed(Exception):
    """The app said lifespan.startup.failed (its message is the exception's)."""


def _error(code, message, exc=None):
    header = {"error": code, "message": message}
    if exc is not None:
        header["traceback"] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return header, b""


class Server:
    def __init__(self, app):
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.state = {}  # the lifespan scope's state, copied into every request's scope
        self.lifespan_task = None
        self.lifespan_events = None
        self.lifespan_replies = None

    # ------------------------------------------------------------ lifespan

    def startup(self):
        """Run the app's lifespan startup; raises when the app says it failed."""
        self.loop.run_until_complete(self._startup())

    async def _startup(self):
        self.lifespan_events = asyncio.Queue()
        self.lifespan_replies = asyncio.Queue()
        scope = {"type": "lifespan", "asgi": ASGI, "state": self.state}

        async def run():
            try:
                await self.app(scope, self.lifespan_events.get, self.lifespan_replies.put)
            except BaseException as exc:  # no lifespan support, or a failure: said below
                await self.lifespan_replies.put({"type": "_raised", "exc": exc})
            else:  # it returned: no lifespan support, or its shutdown is done
                await self.lifespan_replies.put({"type": "_returned"})

        self.lifespan_task = self.loop.create_task(run())
        await self.lifespan_events.put({"type": "lifespan.startup"})
        reply = await self.lifespan_replies.get()
        if reply["type"] == "lifespan.startup.complete":
            return
        if reply["type"] == "lifespan.startup.failed":
            raise LifespanFailed(reply.get("message") or "the app's lifespan startup failed")
        # It raised or returned before completing startup: the app does not speak the protocol.
        self.lifespan_task = None
        why = type(reply["exc"]).__name__ if "exc" in reply else "it returned"
        print(f"asgi: no lifespan support ({why}); serving without it", file=sys.stderr)

    def shutdown(self):
        """Run the app's lifespan shutdown, if it took part in startup."""
        if self.lifespan_task is None or self.lifespan_task.done():
            return
        try:
            self.loop.run_until_complete(asyncio.wait_for(self._shutdown(), SHUTDOWN_SECONDS))
        except BaseException as exc:
            print(f"asgi: lifespan shutdown: {type(exc).__name__}: {exc}", file=sys.stderr)

    async def _shutdown(self):
        await self.lifespan_events.put({"type": "lifespan.shutdown"})
        reply = await self.lifespan_replies.get()
        if reply["type"] == "lifespan.shutdown.failed":
            print(f"asgi: lifespan shutdown failed: {reply.get('message', '')}", file=sys.stderr)

    # ------------------------------------------------------------ http

    def invoke(self, request, body):
        """One request frame in, one reply frame out (header, body)."""
        try:
            return self.loop.run_until_complete(self._http(request, body))
        except BaseException as exc:  # the app's exception, or a malformed event
            return _error("handler_exception", f"{type(exc).__name__}: {exc}", exc)

    def scope(self, request):
        headers = request.get("headers", [])
        host = next((v for k, v in headers if k.lower() == "host"), "localhost")
        name, _, port = host.partition(":")
        # The path includes root_path, as the ASGI spec says and uvicorn does (Starlette strips
        # it; Quart needs it).
        root_path = request.get("script_name", "")
        raw_path = (root_path + (request.get("path", "/") or "/")).encode("latin-1")
        return {
            "type": "http",
            "asgi": ASGI,
            "http_version": request.get("protocol", "HTTP/1.1").partition("/")[2] or "1.1",
            "method": request.get("method", "POST"),
            "scheme": "http",
            "path": unquote_to_bytes(raw_path).decode("utf-8", "replace"),
            "raw_path": raw_path,
            "query_string": request.get("query", "").encode("latin-1"),
            "root_path": root_path,
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
            "client": (request.get("remote_addr", ""), 0),
            "server": (name, int(port) if port.isdigit() else 80),
            "state": dict(self.state),
        }

    async def _http(self, request, body):
        chunks = [body[i:i + CHUNK] for i in range(0, len(body), CHUNK)] or [b""]
        sent = 0
        done = asyncio.Event()
        response = {"status": None, "headers": [], "body": []}

        async def receive():
            nonlocal sent
            if sent < len(chunks):
                sent += 1
                return {"type": "http.request", "body": chunks[sent - 1], "more_body": sent < len(chunks)}
            await done.wait()  # the body is all read: the next event is the end of the connection
            return {"type": "http.disconnect"}

        async def send(message):
            kind = message.get("type")
            if done.is_set():
                raise RuntimeError(f"{kind} sent after the response was complete")
            if kind == "http.response.start":
                if response["status"] is not None:
                    raise RuntimeError("http.response.start sent twice")
                response["status"] = int(message["status"])
                response["headers"] = [[bytes(k).decode("latin-1"), bytes(v).decode("latin-1")]
                                       for k, v in message.get("headers", [])]
            elif kind == "http.response.body":
                if response["status"] is None:
                    raise RuntimeError("http.response.body sent before http.response.start")
                response["body"].append(bytes(message.get("body", b"")))
                if not message.get("more_body", False):
                    done.set()
            # Other events (trailers, extensions the scope did not offer) are not ours to serve.

        try:
            await self.app(self.scope(request), receive, send)
        finally:
            done.set()  # wakes a receive() still waiting: its task ends with the request
        if response["status"] is None:
            return _error("invalid_result", "the ASGI app returned without starting a response")
        return {"status": response["status"], "headers": response["headers"]}, b"".join(response["body"])
