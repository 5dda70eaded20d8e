"""Run a lambda over many items: ``sprout.map(target, items)`` sends them to the worker's
``POST /map/<name>`` in bounded requests, several at once, and yields one result per item.

    import sprout

    for size in sprout.map("resize", images):            # a deployed lambda, in the items' order
        ...
    for n in sprout.map(score, rows, ordered=False):     # a function: shipped once (sprout.ship)
        ...

Items (any iterable, read as they are needed: a generator of a million items is never held
at once) go in requests of at most :data:`MAX_ITEMS` items and about :data:`MAX_BYTES` of
JSON; a sized iterable (a list, a range) goes in about ``4 × concurrency`` requests of at
least :data:`MIN_ITEMS` items, so that they spread over a fleet. ``concurrency`` of them are
in flight, each over a keep-alive connection of the client, and the worker spreads each over
the lambda's sandboxes (docs/offload.md). Results come in the items' order
(``ordered=True``) or request by request as they are answered.

An item whose run failed raises :class:`TaskError` (its code, message, traceback and index)
when its turn comes, after the results before it, or is yielded as that exception with
``return_exceptions=True``. A request that could not be delivered (connection refused or
reset, HTTP 429/502/503 from a worker or a proxy before it) is sent again, up to ``retries``
times after a short backoff: its items may then run twice. Any other failure of a whole
request (404 unknown lambda, 400 ``not_a_function``, 413...) raises :class:`SproutError` at
once. A request waits for its reply as long as the worker works on it (the lambda's time
limit bounds each of its chunks); the client's timeout bounds connecting.

An item whose JSON is larger than :data:`BLOB_MIN` travels through the worker's blob store
(``PUT /blobs/<name>``, 128 random bits naming it; the request carries ``{"$sprout_blob":
name}``), and a result as large comes back the same way (``{"blob": name}`` in the reply,
read with ``GET`` and deleted): neither passes through a request body or a channel frame.

Inside a sandbox, by default, map goes over the sandbox's channel to its worker, one request
at a time (the channel takes calls in turn), within the caller's time left; a function cannot
be shipped from there (a lambda cannot deploy).
"""

import json
import os
import sys
import time
import urllib.parse
from collections import deque

from sprout.client import Client, SproutError, as_client, authorized

MAX_ITEMS = 2048
"""Most items in one request."""
MIN_ITEMS = 64
"""Fewest items a request of a sized map is cut to (see :func:`request_size`)."""
MAX_BYTES = 2 << 20
"""About the most bytes of one request's JSON body (an item larger than that goes alone)."""
BLOB_MIN = 1 << 20
"""An item (or result) whose JSON is larger goes through the blob store (as the helper's)."""
BLOB_KEY = "$sprout_blob"
BLOBS_DIR = "/blobs"
"""Where a sandbox sees the blob store."""
DEFAULT_CONCURRENCY = 4
# Seconds between the caller's looks at its requests: Python runs a Ctrl-C's handler on the
# main thread only when that thread wakes, and the kernel may hand the signal to a request's.
WAKE = 0.2
RETRY_STATUSES = frozenset({429, 502, 503})
"""Statuses of a request that did not reach a sandbox: it is sent again."""
BACKOFF = 0.2
"""Seconds before the first resend; three times longer each next one, up to BACKOFF_MAX."""
BACKOFF_MAX = 5.0

# The status `/run` answers with each error an item can have (docs/api.md), for TaskError.status.
_STATUS = {"handler_exception": 500, "invalid_result": 500, "load_error": 500, "install_failed": 500, "invalid_json": 400,
           "timeout": 504, "out_of_memory": 502, "sandbox_crashed": 502, "call_depth_exceeded": 508}


class TaskError(SproutError):
    """One item of :func:`map` failed: ``index`` (its place among the items), ``code``
    (``handler_exception``, ``timeout``, ``out_of_memory``...), ``message`` and, for an
    exception of the handler, its ``traceback``."""

    def __init__(self, index, code, message="", traceback=None, status=None):
        body = {"error": code, "message": message}
        if traceback is not None:
            body["traceback"] = traceback
        super().__init__(status or _STATUS.get(code, 500), code, message, body)
        self.args = (f"item {index}: {code}: {message}",)
        self.index = index

    def __reduce__(self):
        return TaskError, (self.index, self.code, self.message, self.traceback, self.status)


def map(target, items, *, concurrency=None, ordered=True, retries=2, return_exceptions=False, client=None, chunk=None):
    """Run ``target`` over each of ``items``; yields one result per item.

    ``target``: a deployed lambda's name, or a Python function, shipped as a lambda with the
    modules of its project it imports (:mod:`sprout.ship`; deployed once). ``client``: a
    :class:`Client` or a worker's URL; by default inside a sandbox its channel, else
    ``Client($SPROUT_URL)`` (or the default URL). ``chunk`` (1-1024) fixes how many items one
    sandbox invocation takes; by default the worker sizes chunks (not over a channel).

    The arguments are checked, and a function shipped, at the call; items are read and sent
    as the results are asked for."""
    concurrency = DEFAULT_CONCURRENCY if concurrency is None else concurrency
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise ValueError(f"concurrency must be a positive int, not {concurrency!r}")
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise ValueError(f"retries must be an int >= 0, not {retries!r}")
    if chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool) or not 1 <= chunk <= 1024):
        raise ValueError(f"chunk must be an int from 1 to 1024, not {chunk!r}")
    try:
        count = len(items)  # a list or a range: sized so that the requests spread
    except TypeError:
        count = None  # a generator: read as it goes, in requests of MAX_ITEMS
    items = iter(items)

    channel = sys.modules.get("_sprout_sandbox") if client is None else None
    if channel is not None:
        if not isinstance(target, str):
            raise TypeError("inside a sandbox, sprout.map takes a deployed lambda's name: a lambda cannot deploy a function")
        send = _channel_sender(channel, _lambda_name(target), retries)
        concurrency = 1
        count = None  # one request at a time, to the one worker: no spreading to do
    else:
        client = as_client(client)
        redeploy = None
        if isinstance(target, str):
            name = _lambda_name(target)
        elif callable(target):
            from sprout import ship

            name = ship.deploy(target, client)

            def redeploy():  # the worker lost it (a new worker at the same address?)
                ship.forget(client, name)
                return ship.deploy(target, client)
        else:
            raise TypeError(f"sprout.map needs a lambda's name or a function, not {type(target).__name__}")
        send = _http_sender(client, name, retries, chunk, redeploy)
    return _results(send, batches(items, request_size(count, concurrency)), concurrency, ordered, return_exceptions)


def _lambda_name(name):
    if not name:
        raise ValueError("sprout.map needs a lambda's name")
    return name


# ---------------------------------------------------------------- requests


def request_size(count, concurrency):
    """Most items in one request of a map of ``count`` items (None: not known ahead) with
    ``concurrency`` requests in flight, as ``sprout map`` cuts them: about four requests for
    each in flight, so that behind a fleet's HAProxy (which hands ``/map/`` requests to its
    workers in turn) a map of a few hundred items uses every worker, and one that ends
    unevenly leaves none idle long; at least :data:`MIN_ITEMS` (a request has a cost of its
    own) and at most :data:`MAX_ITEMS`."""
    if count is None:
        return MAX_ITEMS
    return min(MAX_ITEMS, max(MIN_ITEMS, -(-count // (4 * concurrency))))


def batches(items, max_items=None, max_bytes=None):
    """Group ``items`` (an iterator, read only as far as each batch needs) into requests:
    yields (index of the first, [each item's JSON]) with at most ``max_items`` items and, but
    for an item larger than that alone, at most ``max_bytes`` of body (``[a,b,...]``);
    by default :data:`MAX_ITEMS` and :data:`MAX_BYTES`."""
    max_items = MAX_ITEMS if max_items is None else max_items
    max_bytes = MAX_BYTES if max_bytes is None else max_bytes
    batch, size, start = [], 2, 0
    for index, item in enumerate(items):
        try:
            encoded = json.dumps(item, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise TypeError(f"item {index} cannot be sent as JSON: {e}") from e
        if batch and (len(batch) >= max_items or size + len(encoded) + 1 > max_bytes):
            yield start, batch
            batch, size, start = [], 2, index
        batch.append(encoded)
        size += len(encoded) + (1 if len(batch) > 1 else 0)
    if batch:
        yield start, batch


def body_of(batch):
    """A batch's request body: the JSON array of its items (all ASCII: json.dumps escapes)."""
    return ("[" + ",".join(batch) + "]").encode()


def backoff(attempt):
    """Seconds to wait before resend number ``attempt`` (0 for the first)."""
    return min(BACKOFF * 3**attempt, BACKOFF_MAX)


def _retry_after(headers):
    try:
        return min(max(float(headers.get("Retry-After", "")), 0.0), BACKOFF_MAX * 2)
    except (TypeError, ValueError):
        return None


def outcomes_of(status, data, count):
    """The outcome array of a reply (bytes), checked to hold ``count`` outcomes."""
    try:
        outcomes = json.loads(data)
    except ValueError:
        outcomes = None
    if not isinstance(outcomes, list) or len(outcomes) != count:
        got = f"{len(outcomes)} outcomes" if isinstance(outcomes, list) else repr(data[:200])
        raise SproutError(status, "invalid_reply", f"the worker answered {got} for {count} items")
    return outcomes


def _http_sender(client, name, retries, chunk, redeploy=None):
    """``send(batch)`` -> outcomes over HTTP; ``redeploy()``, if given, is called (once a
    batch) when the worker does not know the lambda, and the batch sent again."""
    import http.client

    path = f"/map/{urllib.parse.quote(name, safe='')}" + (f"?chunk={chunk}" if chunk else "")
    headers = {"Content-Type": "application/json"}

    def send(batch):
        blobs = []
        try:
            body = body_of([_put_blob(client, item, blobs) if len(item) > BLOB_MIN else item for item in batch])
            return [_resolve(value, lambda name: _take_blob(client, name)) for value in post(body, len(batch))]
        finally:
            for name in blobs:
                _delete_blob(client, name)

    def post(body, count):
        resent, redeployed = 0, redeploy is None
        while True:
            try:
                reply = client._keep_alive_call("POST", path, body, headers)
            except (OSError, http.client.HTTPException):
                if resent >= retries:
                    raise
                wait = None
            else:
                if reply.status == 404 and not redeployed and _error_code(reply.body) == "lambda_not_found":
                    redeploy()
                    redeployed = True
                    continue
                if reply.status not in RETRY_STATUSES or resent >= retries:
                    Client._check(reply)
                    return outcomes_of(reply.status, reply.body, count)
                wait = _retry_after(reply.headers)
            time.sleep(backoff(resent) if wait is None else wait)
            resent += 1

    return send


def _blob_call(client, method, name, body=None):
    return client._keep_alive_call(method, f"/blobs/{name}", body, authorized(client))


def _put_blob(client, item, names):
    """Send item (its JSON) to the blob store; the reference the request carries instead."""
    name = os.urandom(16).hex() + ".json"
    Client._check(_blob_call(client, "PUT", name, item.encode()))
    names.append(name)
    return json.dumps({BLOB_KEY: name})


def _take_blob(client, name):
    """A result in the blob store: read, then deleted."""
    data = Client._check(_blob_call(client, "GET", name)).body
    _delete_blob(client, name)
    return data


def _delete_blob(client, name):
    try:
        _blob_call(client, "DELETE", name)
    except (OSError, ValueError):
        pass  # the worker removes it when its time is up


def _take_local_blob(name):
    """A result in the blob store, from inside a sandbox (which sees it at /blobs)."""
    if not isinstance(name, str) or "/" in name or name.startswith("."):
        raise ValueError(f"{name!r} is not a blob's name")
    path = os.path.join(BLOBS_DIR, name)
    with open(path, "rb") as f:
        data = f.read()
    try:
        os.unlink(path)
    except OSError:
        pass
    return data


def _resolve(value, take):
    """An outcome with its result in the blob store (``{"blob": name}``) as ``{"result": ...}``;
    any other as it is. A blob that cannot be read is the item's ``invalid_reply``."""
    if not (isinstance(value, dict) and set(value) == {"blob"}):
        return value
    try:
        return {"result": json.loads(take(value["blob"]))}
    except (SproutError, OSError, ValueError) as e:
        return {"error": "invalid_reply", "message": f"the result's blob {value['blob']!r} cannot be read: {e}"}


def _error_code(data):
    try:
        return json.loads(data).get("error")
    except (ValueError, AttributeError):
        return None


def _channel_sender(channel, name, retries):
    from sprout.platform import InvokeError

    def send(batch):
        body = body_of(batch)
        resent = 0
        while True:
            header, reply = channel.call(name, body, batch=True)
            if "error" not in header:
                return [_resolve(value, _take_local_blob) for value in outcomes_of(200, reply, len(batch))]
            status = header.get("status", 500)
            if status not in RETRY_STATUSES or resent >= retries:
                raise InvokeError(status, header["error"], header.get("message", ""), header)
            time.sleep(backoff(resent))
            resent += 1

    return send


# ---------------------------------------------------------------- results


def in_flight(send, batches, concurrency, ordered):
    """Send each of ``batches`` ((start, batch) pairs) with ``send(batch)`` -> outcomes,
    ``concurrency`` at once on threads; yields (start, outcomes) in the batches' order
    (``ordered``; a batch answered early waits for those before it, at most ``concurrency``
    of them held) or as each is answered. A batch whose send raised raises when it is reached.
    Batches are read only as requests are made; a single batch is sent on the caller's thread."""
    first = next(batches, None)
    if first is None:
        return
    second = next(batches, None)
    if second is None:
        yield first[0], send(first[1])
        return
    from concurrent.futures import FIRST_COMPLETED, wait

    pool = _Pool(concurrency)
    window = 2 * concurrency if ordered else concurrency
    pending = deque()
    waiting = [first, second]

    def refill():
        while len(pending) < window:
            nxt = waiting.pop(0) if waiting else next(batches, None)
            if nxt is None:
                return
            start, batch = nxt
            pending.append((start, pool.submit(send, batch)))

    try:
        refill()
        while pending:
            if ordered:
                start, future = pending.popleft()
                while not future.done():
                    wait([future], timeout=WAKE)
                outcomes = future.result()
                refill()
                yield start, outcomes
                continue
            done = []
            while not done:
                wait([f for _, f in pending], timeout=WAKE, return_when=FIRST_COMPLETED)
                done = [(s, f) for s, f in pending if f.done()]
            for entry in done:
                pending.remove(entry)
            refill()
            for start, future in done:
                yield start, future.result()
    finally:
        for _, future in pending:
            future.cancel()
        pool.shutdown()


class _Pool:
    """``size`` daemon threads running what is submitted, in turn: a map given up (an error,
    a ``break``, Ctrl-C) leaves its requests under way to end on their own, without holding
    the interpreter's exit as ThreadPoolExecutor's threads would."""

    def __init__(self, size):
        import queue

        self.size, self.threads, self.tasks = size, [], queue.SimpleQueue()

    def submit(self, fn, *args):
        import threading
        from concurrent.futures import Future

        future = Future()
        self.tasks.put((future, fn, args))
        if len(self.threads) < self.size:
            thread = threading.Thread(target=self._work, name=f"sprout-map-{len(self.threads)}", daemon=True)
            thread.start()
            self.threads.append(thread)
        return future

    def _work(self):
        while True:
            task = self.tasks.get()
            if task is None:
                return
            future, fn, args = task
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:
                future.set_exception(e)

    def shutdown(self):
        for _ in self.threads:
            self.tasks.put(None)


def outcome(index, value, return_exceptions):
    """An outcome's result, or its TaskError (raised, or returned with ``return_exceptions``)."""
    if isinstance(value, dict) and "result" in value and "error" not in value:
        return value["result"]
    if isinstance(value, dict) and "error" in value:
        error = TaskError(index, str(value["error"]), str(value.get("message", "")), value.get("traceback"), value.get("status"))
    else:
        error = TaskError(index, "invalid_reply", f"the worker answered {value!r} for this item")
    if return_exceptions:
        return error
    raise error


def _results(send, batches, concurrency, ordered, return_exceptions):
    for start, outcomes in in_flight(send, batches, concurrency, ordered):
        for offset, value in enumerate(outcomes):
            yield outcome(start + offset, value, return_exceptions)
