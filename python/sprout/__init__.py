"""Sprout: serverless Python functions in lean sandboxes.

``sprout.Client`` talks to a worker's HTTP API; ``sprout.map(target, items)`` runs a lambda
(or a Python function, shipped as one by ``sprout.ship``) over many items, spread over the
worker's sandboxes (``sprout.offload``); ``sprout.Lease(target, parts)`` holds sandboxes for an
object's life, each keeping its state between calls (``sprout.lease``); inside a sandbox, ``sprout.services()`` names the
services a lambda may reach, ``sprout.invoke(name, event)`` calls another lambda and
``sprout.request_id()`` names the request being served (``sprout.platform``);
``sprout.runtime`` is what runs inside the sandboxes (standard library only).
"""

from sprout.client import Client, Response, SproutError, pack
from sprout.platform import InvokeError, invoke, request_id, service, services


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


__all__ = ["Client", "Response", "SproutError", "pack", "TaskError", "map", "Lease", "InvokeError", "invoke", "request_id", "service",
           "services"]
