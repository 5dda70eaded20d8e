"""Sprout: serverless Python functions in lean sandboxes.

``sprout.Client`` talks to a worker's HTTP API; ``sprout.map(target, items)`` runs a lambda
(or a Python function, shipped as one by ``sprout.ship``) over many items, spread over the
worker's sandboxes (``sprout.offload``); ``sprout.Lease(target, parts)`` holds sandboxes for an
object's life, each keeping its state between calls (``sprout.lease``); inside a sandbox, ``sprout.services()`` names the
services a lambda may reach, ``sprout.invoke(name, event)`` calls another lambda and
``sprout.request_id()`` names the request being served and ``sprout.on_park(fn)`` runs ``fn``
before the sandbox is parked (``sprout.platform``);
``sprout.runtime`` is what runs inside the sandboxes (standard library only).
"""

from sprout.client import Client, Response, SproutError, pack
from sprout.platform import InvokeError, invoke, on_park, request_id, service, services


def _client_map(self, target, items, **options):
    """``sprout.map(target, items, client=self, **options)``: run a lambda (or a Python
    function, shipped as one) over many items; yields the results."""
    from sprout.offload import map as offload_map

    return offload_map(target, items, client=self, **options)


# Client.map is set here, above both: sprout.offload (sprout.map) uses sprout.client, and is
# imported only when first used.
_client_map.__name__, _client_map.__qualname__ = "map", "Client.map"
Client.map = _client_map


def __getattr__(name):
    # sprout.map, sprout.TaskError and sprout.Lease are imported when first used: a lambda that only
    # invokes others does not pay for them.
    if name in ("map", "TaskError"):
        from sprout import offload

        return getattr(offload, name)
    if name == "Lease":
        from sprout.lease import Lease

        return Lease
    raise AttributeError(f"module 'sprout' has no attribute {name!r}")


__all__ = ["Client", "Response", "SproutError", "pack", "TaskError", "map", "Lease", "InvokeError", "invoke", "on_park",
           "request_id", "service", "services"]
