"""Sprout: serverless Python functions in lean sandboxes.

``sprout.Client`` talks to a worker's HTTP API; ``sprout.runtime`` is what runs inside the
sandboxes (standard library only).
"""

from sprout.client import Client, Response, SproutError, pack

__all__ = ["Client", "Response", "SproutError", "pack"]
