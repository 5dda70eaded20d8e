"""Sprout: serverless Python functions in lean sandboxes.

``sprout.Client`` talks to a worker's HTTP API; inside a sandbox, ``sprout.services()`` names
the services a lambda may reach, ``sprout.invoke(name, event)`` calls another lambda and
``sprout.request_id()`` names the request being served (``sprout.platform``);
``sprout.runtime`` is what runs inside the sandboxes (standard library only).
"""

from sprout.client import Client, Response, SproutError, pack
from sprout.platform import InvokeError, invoke, request_id, service, services

__all__ = ["Client", "Response", "SproutError", "pack", "InvokeError", "invoke", "request_id", "service", "services"]
