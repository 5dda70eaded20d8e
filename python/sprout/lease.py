"""Hold sandboxes for the life of an object: ``sprout.Lease(target, parts)`` asks the worker
for ``parts`` sandboxes of a lambda (``POST /leases/<name>``), each keeping the state of its
module globals between calls, and runs ``f(event)`` on the one a call names.

    import sprout

    with sprout.Lease("counter", 2) as lease:     # a deployed lambda, or a function (shipped)
        lease.call(0, {"add": 1})
        lease.call(1, {"add": 5})                  # another sandbox, with state of its own

The lease is released (its sandboxes destroyed: they hold this object's state) by
:meth:`Lease.release`, at the end of a ``with`` block, when the object is garbage-collected,
or at interpreter exit. While the object lives a daemon thread sends keepalives every
``idle_timeout / 3`` seconds, so a client killed outright loses its lease once the worker has
seen it idle for ``idle_timeout`` seconds. A part whose sandbox died raises
:class:`SproutError` ``lease_part_lost`` from then on: its state is gone, and what to do is
the caller's choice (docs/api.md, leases). The parts share a directory, ``lease.dir``
(``/leases/<id>`` in each), removed with the lease; :mod:`sprout.elastic` keeps its tiles
there.
"""

import json
import threading
import urllib.parse
import weakref

from sprout.client import Client, SproutError, as_client, authorized

DEFAULT_IDLE_TIMEOUT = 60


def _send(client, method, path, body=None, read_timeout=None):
    headers = {"Content-Type": "application/json"} if body is not None else {}
    return client._keep_alive_call(method, path, body, authorized(client, headers), read_timeout=read_timeout)


def _release(client, lease_id, stop):
    """Release lease ``lease_id`` (the finalizer: never raises)."""
    stop.set()
    try:
        _send(client, "DELETE", f"/leases/{lease_id}", read_timeout=30)
    except Exception:  # noqa: BLE001 - at exit or collection there is no one to tell
        pass


def _keep_alive(client, lease_id, stop, interval):
    """Keep lease ``lease_id`` alive every ``interval`` seconds until ``stop`` is set or the
    worker no longer knows it. Holds no reference to the :class:`Lease`, so the object can
    still be collected."""
    while not stop.wait(interval):
        try:
            reply = _send(client, "POST", f"/leases/{lease_id}/keepalive", read_timeout=max(interval, 5))
        except Exception:  # noqa: BLE001 - a missed keepalive; the next one may get through
            continue
        if reply.status == 404:
            return


class Lease:
    """``parts`` sandboxes of ``target`` held for this object's life.

    ``target``: a deployed lambda's name, or a Python function, shipped as a lambda as
    :func:`sprout.map` ships one (:mod:`sprout.ship`). ``client``: a :class:`sprout.Client`
    or a URL (by default ``Client($SPROUT_URL)``); the worker's token is needed.
    ``idle_timeout`` (1-3600 s): how long the worker keeps the lease without a call or a
    keepalive. Making it waits for the sandboxes' cold starts; a worker without room for
    them raises :class:`SproutError` (``queue_full``, ``queue_timeout``, ``memory_budget``)
    and keeps none."""

    def __init__(self, target, parts, *, client=None, idle_timeout=DEFAULT_IDLE_TIMEOUT):
        if not isinstance(parts, int) or isinstance(parts, bool) or parts < 1:
            raise ValueError(f"parts must be a positive int, not {parts!r}")
        if not isinstance(idle_timeout, int) or isinstance(idle_timeout, bool) or not 1 <= idle_timeout <= 3600:
            raise ValueError(f"idle_timeout must be an int from 1 to 3600 seconds, not {idle_timeout!r}")
        client = as_client(client)
        if isinstance(target, str):
            if not target:
                raise ValueError("sprout.Lease needs a lambda's name")
            name = target
        elif callable(target):
            from sprout import ship

            name = ship.deploy(target, client)
        else:
            raise TypeError(f"sprout.Lease needs a lambda's name or a function, not {type(target).__name__}")
        body = json.dumps({"parts": parts, "idle_timeout_s": idle_timeout}).encode()
        reply = Client._check(_send(client, "POST", f"/leases/{urllib.parse.quote(name, safe='')}", body))
        made = json.loads(reply.body)
        self.client = client
        self.id = made["lease"]
        self.lambda_name = made["lambda"]
        self.parts = made["parts"]
        self.idle_timeout = made["idle_timeout_s"]
        self.dir = made["dir"]  # where every part sees the lease's shared directory
        self._stop = threading.Event()
        self._finalizer = weakref.finalize(self, _release, client, self.id, self._stop)
        interval = self.idle_timeout / 3
        threading.Thread(target=_keep_alive, args=(client, self.id, self._stop, interval), daemon=True,
                         name=f"sprout-lease-{self.id[:8]}").start()

    def call(self, part, event=None):
        """Run ``f(event)`` on part ``part``'s sandbox (0 to ``parts - 1``); returns what it
        returned. Raises :class:`SproutError` as :meth:`Client.run` does, with
        ``lease_part_lost`` for a part whose sandbox died and ``lease_not_found`` for a lease
        released (or expired)."""
        if not isinstance(part, int) or isinstance(part, bool):
            raise TypeError(f"a part is an int, not {type(part).__name__}")
        if not 0 <= part < self.parts:
            raise IndexError(f"this lease has parts 0 to {self.parts - 1}, not {part}")
        if not self._finalizer.alive:
            raise SproutError(404, "lease_not_found", f"lease {self.id} was released")
        reply = _send(self.client, "POST", f"/leases/{self.id}/{part}", json.dumps(event).encode())
        return json.loads(Client._check(reply).body)

    def keepalive(self):
        """Reset the lease's idle clock now (the thread does it every ``idle_timeout / 3``)."""
        Client._check(_send(self.client, "POST", f"/leases/{self.id}/keepalive"))

    def release(self):
        """Give the sandboxes back (they are destroyed); later calls raise. Idempotent."""
        self._finalizer()

    @property
    def released(self):
        return not self._finalizer.alive

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __len__(self):
        return self.parts

    def __repr__(self):
        state = "released" if self.released else "held"
        return f"<sprout.Lease {self.id} of {self.lambda_name!r}: {self.parts} parts, {state}>"
