"""Sprout: serverless Python functions in lean sandboxes.

``sprout.Client`` talks to a worker's HTTP API; ``sprout.map(target, items)`` runs a lambda
(or a Python function, shipped as one by ``sprout.ship``) over many items, spread over the
worker's sandboxes (``sprout.offload``); inside a sandbox, ``sprout.services()`` names the
services a lambda may reach, ``sprout.invoke(name, event)`` calls another lambda and
``sprout.request_id()`` names the request being served (``sprout.platform``);
``sprout.runtime`` is what runs inside the sandboxes (standard library only).
"""

from sprout.client import Client, Response, SproutError, pack
from sprout.platform import InvokeError, invoke, request_id, service, services


def __getattr__(name):
    # sprout.map and sprout.TaskError are imported when first used: a lambda that only
    # invokes others does not pay for them.
    if name in ("map", "TaskError"):
        from sprout import offload

        return getattr(offload, name)
    raise AttributeError(f"module 'sprout' has no attribute {name!r}")


__all__ = ["Client", "Response", "SproutError", "pack", "TaskError", "map", "InvokeError", "invoke", "request_id", "service",
           "services"]
