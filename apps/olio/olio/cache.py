"""Caching of rendered fragments and query results in the memcached tier, or nothing.

With `config.cache` set (``host:port,...``: the Sprout cache or memcached), values live in
those servers through `sprout.cache` (consistent hashing over the servers); without it,
every lookup computes its value, so pages are the same either way.

Keys are explicit: ``olio:<namespace>:<name>``, the namespace a hash of the database URL
(two sites sharing a cache never see each other's values), any user-supplied part hashed
(keys stay short and free of spaces). Invalidation is by generation counters: a cached value's
key includes the current value of the counters it depends on (e.g. ``gen:events`` for the
home page's event lists), and a write bumps those counters after it commits, so readers
move to new keys at once and old values just expire. Every value also has a TTL, which
bounds staleness where time alone changes a page (an event passing out of "upcoming") and
where a counter bump was lost (a server that was briefly unreachable).

A cache server that is down degrades to no caching: its keys read as misses and writes to it
are dropped (pymemcache's ``ignore_exc``), it is taken out of the ring at its first failure
and tried again after DEAD_SECONDS, and any other error of the cache is logged and ignored.
Values are pickles, so the cache servers must be reachable only by Olio.
"""

import hashlib
import logging
import os
import time

log = logging.getLogger("olio.cache")

DEAD_SECONDS = 10
# How long each kind of value may live (seconds).
TTL_LISTS = 60  # home page and tag search event lists: time passes, events start
TTL_CLOUD = 120  # the tag cloud
TTL_PAGES = 300  # event and person page data (invalidated by counters anyway)


def hashed(text):
    """A short, key-safe stand-in for user-supplied text."""
    return hashlib.sha1(str(text).encode()).hexdigest()[:20]


class NoCache:
    """Caching off: compute every value."""

    enabled = False

    def fetch(self, key, ttl, compute, depends=()):
        return compute()

    def bump(self, *counters):
        pass


class Cache:
    """Values in memcached-protocol servers, under keys qualified by generation counters."""

    enabled = True

    def __init__(self, servers, namespace):
        self.servers = servers
        self.prefix = f"olio:{hashed(namespace)[:10]}:"
        self._client = None
        self._pid = None

    def client(self):
        """This process's client (made after a fork: sockets are not shared with a parent)."""
        if self._pid != os.getpid():
            import sprout.cache

            self._client = sprout.cache.client(
                self.servers, ignore_exc=True, retry_attempts=0, dead_timeout=DEAD_SECONDS,
                connect_timeout=0.5, timeout=2.0,
            )
            self._pid = os.getpid()
        return self._client

    def _call(self, operation, *args, default=None, **kwargs):
        try:
            return getattr(self.client(), operation)(*args, **kwargs)
        except Exception as e:  # a cache must never break a page
            log.warning("cache %s failed: %s", operation, e)
            return default

    def generation(self, counter):
        """The current value of a generation counter (made, from the clock, if missing:
        a counter that was evicted never comes back with a value it had before)."""
        key = self.prefix + "gen:" + counter
        value = self._call("get", key)
        if value is None:
            self._call("add", key, str(time.time_ns() // 1000), noreply=False)
            value = self._call("get", key)
        return value

    def bump(self, *counters):
        """Move every value that depends on `counters` to new keys (call after a commit)."""
        for counter in counters:
            key = self.prefix + "gen:" + counter
            if self._call("incr", key, 1, noreply=False) is None:
                self._call("add", key, str(time.time_ns() // 1000), noreply=False)

    def fetch(self, key, ttl, compute, depends=()):
        """The value cached under `key` (and the generations of `depends`), or `compute()`'s,
        stored for `ttl` seconds."""
        generations = [self.generation(counter) for counter in depends]
        if any(g is None for g in generations):  # no server answers: do not cache
            return compute()
        full = self.prefix + key + "".join(f":{g}" for g in generations)
        value = self._call("get", full)
        if value is not None:
            return value
        value = compute()
        self._call("set", full, value, expire=ttl)
        return value


def make(config):
    """The cache `config` asks for: Cache over its servers, or NoCache."""
    servers = config.cache_servers
    if not servers:
        return NoCache()
    return Cache(servers, config.db)


# The generation counters and what bumps them.
def events_counter():
    """Every event list and the tag cloud: bumped when an event is added."""
    return "events"


def event_counter(event_id):
    """One event's page: bumped by attendance and comment changes."""
    return f"event:{event_id}"


def person_counter(user_id):
    """One person's page: bumped by their new events and friendship changes."""
    return f"user:{user_id}"
