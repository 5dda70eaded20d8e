"""sprout.cache: a memcached client for Sprout's cache (`sprout cache serve`) or stock memcached.

A thin layer over pymemcache (``pip install pymemcache``)::

    import sprout.cache

    cache = sprout.cache.client(["10.0.0.5:11211", "10.0.0.6:11211"])  # or "a:11211,b:11211"
    cache.set("user:42", {"name": "ada"}, expire=300)                   # any picklable value
    cache.get("user:42")                                                 # -> {"name": "ada"}
    cache = sprout.cache.client(sprout.cache.servers_from_env())         # $SPROUT_CACHE_SERVERS
    cache = sprout.cache.client("cache")                                 # the sandbox's service "cache"

It returns a pymemcache ``HashClient`` with rendezvous (consistent) hashing, so keys are spread
over the servers and removing one of n servers moves only that server's keys (about 1/n). The
servers may be any mix of Sprout caches and stock memcached: both speak the same protocol.

What you get when a server dies (the defaults, ``ignore_exc=False``): operations on keys that
map to it raise (``OSError``/``MemcacheError``), and read as misses between tries; after
``retry_attempts`` failed tries, ``retry_timeout`` seconds apart (about 5 calls over 3 s), it
is taken out of the ring for ``dead_timeout`` seconds and its keys go to the other servers.
With ``ignore_exc=True`` nothing raises: a dead server's keys read as misses and their writes
are dropped (set returns False) — a cache that degrades, which most applications want; add
``retry_attempts=0`` to take a dead server out at its first failure.

Values are pickled (``pymemcache.serde.pickle_serde``: bytes, str and int are stored as
themselves, anything else as a pickle, so use caches only your own code can write to);
``set`` waits for the server's answer (``noreply=False``) so that a refused value (e.g. over
the item size limit) raises. Any keyword argument of ``HashClient`` overrides these defaults.
"""

import os

from pymemcache.client.base import normalize_server_spec
from pymemcache.client.hash import HashClient
from pymemcache.client.rendezvous import RendezvousHash
from pymemcache.serde import pickle_serde

from sprout.platform import services as _services

__all__ = ["client", "parse_servers", "servers_from_env", "DEFAULT_SERVERS", "DEFAULTS"]

DEFAULT_SERVERS = "127.0.0.1:11211"

DEFAULTS = dict(
    hasher=RendezvousHash,  # consistent: removing a server remaps only its own keys
    serde=pickle_serde,
    connect_timeout=2.0,  # seconds to open a connection
    timeout=5.0,  # seconds for one operation (a 1 MiB value on a slow link fits)
    no_delay=True,
    use_pooling=True,  # safe to share between threads
    ignore_exc=False,  # errors raise; see the module docstring
    retry_attempts=2,  # failed tries before a server is taken out of the ring
    retry_timeout=1,  # seconds between those tries
    dead_timeout=60,  # seconds a server stays out before it is tried again
    default_noreply=False,  # set/add/... report what the server answered
)


def parse_servers(servers):
    """[(host, port), ...] from "h:p", "h1:p1,h2:p2", "h" (port 11211), [::1]:p, or a list of
    such strings and (host, port) tuples. A bare name of a service this sandbox may reach
    (``sprout.services()``) is that service's address and port."""
    if isinstance(servers, str):
        servers = servers.replace(",", " ").split()
    elif isinstance(servers, tuple) and len(servers) == 2 and isinstance(servers[1], int):
        servers = [servers]
    known = _services()
    out = []
    for server in servers:
        if isinstance(server, (tuple, list)):
            host, port = server
        elif server.strip() in known:
            host, _, port = known[server.strip()].rpartition(":")
        else:
            host, port = normalize_server_spec(server.strip())
        out.append((host, int(port)))
    if not out:
        raise ValueError("no cache servers given")
    return out


def servers_from_env(var="SPROUT_CACHE_SERVERS", default=DEFAULT_SERVERS):
    """The servers listed in the environment variable `var` (comma- or space-separated
    host:port); when it is unset or empty, the sandbox's service named "cache" if it may
    reach one, else `default`."""
    return parse_servers(os.environ.get(var, "").strip() or ("cache" if "cache" in _services() else default))


def client(servers=DEFAULT_SERVERS, **kwargs):
    """A pymemcache HashClient over `servers` (see parse_servers) with DEFAULTS, overridden
    by `kwargs`."""
    options = {**DEFAULTS, **kwargs}
    return HashClient(parse_servers(servers), **options)
