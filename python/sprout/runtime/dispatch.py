"""One request on the lambda's entry point, and its reply frame's header and body.

The entry is ``f(event)`` on a JSON event, or on each event of a map's batch (large items and
results through the blob store), or a WSGI app; a failure is an error header with its code,
message and the handler's traceback.

Loaded by the helper by path, as ``_sprout_dispatch`` (load.py); standard library only.
"""

import io
import json
import os
import sys
import traceback

import _sprout_load as load


def short_traceback(exc):
    """The traceback from the handler's frames down, without the frame of the runtime that
    caught it."""
    tb = exc.__traceback__
    if tb is not None and os.path.dirname(tb.tb_frame.f_code.co_filename) == load.RUNTIME_DIR:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


EXIT_OUT_OF_MEMORY = 75  # a pod's handler past its memory limit (see pod.py's serve_pod)


def error_reply(code, message, exc=None):
    """The reply to a request that failed: (error header, empty body)."""
    if load.MEMORY_LIMITED and isinstance(exc, MemoryError):
        # What the kernel's OOM killer does to a lean sandbox: the handler dies, and its pod
        # tells the worker why (its exit status).
        os._exit(EXIT_OUT_OF_MEMORY)
    header = {"error": code, "message": message}
    if exc is not None:
        header["traceback"] = short_traceback(exc)
    return header, b""


def call_function(func, event, allow_nan=True):
    """f(event): (its result as JSON, None), or (None, the error header) when it raised or
    returned what JSON cannot encode (with allow_nan=False, NaN and infinities too)."""
    try:
        result = func(event)
    except BaseException as exc:  # a handler's SystemExit is its failure too
        return None, error_reply("handler_exception", f"{type(exc).__name__}: {exc}", exc)[0]
    try:
        return json.dumps(result, allow_nan=allow_nan).encode(), None
    except (TypeError, ValueError) as exc:
        return None, error_reply("invalid_result", f"handler returned a value JSON cannot encode: {exc}")[0]


JSON_REPLY = {"status": 200, "headers": [["Content-Type", "application/json"]]}


def invoke_function(func, request, body):
    if body.strip():
        try:
            event = json.loads(body)
        except ValueError as exc:
            return error_reply("invalid_json", f"request body is not JSON: {exc}")
    else:
        event = None
    out, error = call_function(func, event)
    if error is not None:
        return error, b""
    return dict(JSON_REPLY), out


BLOB_DIR = "/blobs"  # the worker's blob store (crates/worker/src/blobs.rs)
BLOB_KEY = "$sprout_blob"
BLOB_MIN = 1 << 20  # a map's result whose JSON is larger goes to the blob store


def _blob_path(name):
    if not isinstance(name, str) or not 1 <= len(name) <= 128 or name.startswith(".") or \
            not all(c.isascii() and (c.isalnum() or c in "._-") for c in name):
        raise ValueError(f"{name!r} is not a blob's name")
    return os.path.join(BLOB_DIR, name)


def unblob(event):
    """A map's item: ``{"$sprout_blob": name}`` is the JSON in blob ``name`` (an item too
    large for a request body, docs/offload.md); anything else is itself."""
    if isinstance(event, dict) and len(event) == 1 and BLOB_KEY in event:
        with open(_blob_path(event[BLOB_KEY]), "rb") as f:
            return json.loads(f.read())
    return event


def blob_outcome(out):
    """A result's JSON too large for the reply frame, written as a blob of its own (128
    random bits name it; only this sandbox's user owns it): ``{"blob": name}``. None when it
    is small, or there is no blob store."""
    if len(out) <= BLOB_MIN or not os.path.isdir(BLOB_DIR):
        return None
    name = os.urandom(16).hex() + ".json"
    fd = os.open(_blob_path(name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(out)
    return json.dumps({"blob": name}).encode()


def invoke_batch(func, request, body):
    """A chunk of a map: the body is a JSON array of events; f(event) runs for each in turn,
    and the reply is a JSON array of their outcomes, ``{"result": r}``, ``{"blob": name}``
    (a result of more than BLOB_MIN bytes of JSON, in the blob store) or ``{"error": code,
    "message": m, "traceback": t}`` (an item's failure is its own; the others go on). An
    event ``{"$sprout_blob": name}`` is read from the blob store first."""
    try:
        events = json.loads(body)
    except ValueError as exc:
        return error_reply("invalid_json", f"a batch's body is not JSON: {exc}")
    if not isinstance(events, list):
        return error_reply("invalid_json", "a batch's body must be a JSON array of events")
    outcomes = []
    for event in events:
        try:
            event = unblob(event)
        except (OSError, ValueError) as exc:
            error = error_reply("invalid_json", f"the item's blob cannot be read: {type(exc).__name__}: {exc}")[0]
            outcomes.append(json.dumps({**error, "traceback": None}).encode())
            continue
        out, error = call_function(func, event, allow_nan=False)  # the worker reads the outcomes
        if error is None:
            try:
                outcomes.append(blob_outcome(out) or b'{"result":' + out + b"}")
            except OSError as exc:
                error = error_reply("invalid_result", f"the result ({len(out)} bytes of JSON) cannot be written as a blob: {exc}")[0]
        if error is not None:
            error.setdefault("traceback", None)
            outcomes.append(json.dumps(error).encode())
    return dict(JSON_REPLY), b"[" + b",".join(outcomes) + b"]"


def wsgi_environ(request, body):
    from urllib.parse import unquote_to_bytes

    headers = request.get("headers", [])
    host = next((v for k, v in headers if k.lower() == "host"), "localhost")
    name, _, port = host.partition(":")
    environ = {
        "REQUEST_METHOD": request.get("method", "POST"),
        "SCRIPT_NAME": request.get("script_name", ""),
        "PATH_INFO": unquote_to_bytes(request.get("path", "/") or "/").decode("latin-1"),
        "QUERY_STRING": request.get("query", ""),
        "SERVER_NAME": name,
        "SERVER_PORT": port or "80",
        "SERVER_PROTOCOL": request.get("protocol", "HTTP/1.1"),
        "REMOTE_ADDR": request.get("remote_addr", ""),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": False,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    for key, value in headers:
        key = key.upper().replace("-", "_")
        if key == "CONTENT_TYPE":
            environ["CONTENT_TYPE"] = value
        elif key == "CONTENT_LENGTH":
            environ["CONTENT_LENGTH"] = value
        else:
            name = "HTTP_" + key
            environ[name] = environ[name] + "," + value if name in environ else value
    environ.setdefault("CONTENT_LENGTH", str(len(body)))
    return environ


def invoke_wsgi(app, request, body):
    started = []

    def start_response(status, response_headers, exc_info=None):
        if exc_info is not None and started:
            raise exc_info[1].with_traceback(exc_info[2])
        started[:] = [(status, list(response_headers))]
        return lambda data: chunks.append(bytes(data))

    chunks = []
    try:
        result = app(wsgi_environ(request, body), start_response)
        try:
            for chunk in result:
                chunks.append(bytes(chunk))
        finally:
            if hasattr(result, "close"):
                result.close()
    except BaseException as exc:
        return error_reply("handler_exception", f"{type(exc).__name__}: {exc}", exc)
    if not started:
        return error_reply("invalid_result", "WSGI app returned without calling start_response")
    status, response_headers = started[0]
    try:
        code = int(str(status).split(" ", 1)[0])
    except ValueError:
        return error_reply("invalid_result", f"WSGI app gave a malformed status {status!r}")
    return {"status": code, "headers": [[k, v] for k, v in response_headers]}, b"".join(chunks)


def refuse_batch(kind):
    """What answers a map's chunk for a lambda that is a WSGI or ASGI app: a refusal, before
    the app sees anything."""
    def refuse(_app, _request, _body):
        return error_reply("not_a_function", f"the lambda is a {kind.upper()} app; a map calls a function f(event)")
    return refuse
