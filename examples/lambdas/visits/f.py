"""A lambda that uses the cache tier: counts visits per page in the Sprout cache (any
memcached works), through pymemcache (listed in requirements.txt). The cache is the worker's
service named "cache" ([[network.allow]] in its config): the only thing on the network this
lambda's sandbox can reach."""
from pymemcache.client.base import Client

import sprout

# Made once per sandbox: warm invocations reuse the connection.
cache = Client(sprout.service("cache"), connect_timeout=1, timeout=1)


def f(event):
    page = str((event or {}).get("page", "home"))
    key = f"visits:{page}"
    count = cache.incr(key, 1)
    if count is None:
        # First visit: add (not set), so two first visits at once cannot both start at 1.
        count = 1 if cache.add(key, b"1", noreply=False) else cache.incr(key, 1)
    return {"page": page, "visits": int(count)}
