"""Real, independent memcached clients work against the Sprout cache: pymemcache (text
protocol), python-binary-memcached (binary protocol), the libmemcached-tools command line
programs over both protocols, and sprout.cache.client over several servers (consistent
hashing, a server dying).
"""

import os
import subprocess
from collections import Counter

import pytest

pymemcache = pytest.importorskip("pymemcache", reason="pip install pymemcache")
bmemcached = pytest.importorskip("bmemcached", reason="pip install python-binary-memcached")

from pymemcache.client.base import Client  # noqa: E402
from pymemcache.exceptions import MemcacheError, MemcacheServerError  # noqa: E402

import sprout.cache  # noqa: E402

MIB = 1 << 20
NEAR_LIMIT = MIB - 1024  # the largest values a default (-I 1m) cache must take, with key and header


@pytest.fixture
def fresh(sprout_cache_server):
    Client(sprout_cache_server).flush_all()
    return sprout_cache_server


# ---------------------------------------------------------------- pymemcache: text protocol

def test_pymemcache(fresh):
    c = Client(fresh, default_noreply=False, connect_timeout=2, timeout=5)
    assert c.set("a", b"1") and c.get("a") == b"1" and c.get("nokey") is None
    assert c.set_many({"b": b"2", "c": b"3"}) == [] and c.get_many(["a", "b", "c", "d"]) == {"a": b"1", "b": b"2", "c": b"3"}
    assert c.add("a", b"x") is False and c.replace("nokey", b"x") is False and c.add("d", b"4")
    value, cas = c.gets("a")
    assert value == b"1" and c.cas("a", b"one", cas) and c.cas("a", b"uno", cas) is False and c.get("a") == b"one"
    assert c.cas("nokey", b"x", cas) is None
    assert c.incr("b", 40) == 42 and c.decr("b", 50) == 0 and c.incr("nokey", 1) is None
    assert c.set("n", b"100") and c.decr("n", 1) == 99 and c.get("n") == b"99 "  # memcached pads in place
    assert c.append("c", b"4") and c.prepend("c", b"2") and c.get("c") == b"234"
    assert c.touch("a", 100) and c.touch("nokey", 100) is False
    assert c.delete("a") and c.delete("a") is False and c.get("a") is None
    big = os.urandom(NEAR_LIMIT)
    assert c.set("big", big) and c.get("big") == big
    with pytest.raises(MemcacheServerError, match="object too large for cache"):
        c.set("huge", os.urandom(MIB))
    assert c.get("big") == big  # the connection is fine
    assert c.flush_all() and c.get("b") is None
    assert c.version()
    c.close()


# ---------------------------------------------------------------- python-binary-memcached: binary protocol

def test_binary_memcached(fresh):
    c = bmemcached.Client([f"{fresh[0]}:{fresh[1]}"], socket_timeout=5)
    assert c.set("a", "hello") and c.get("a") == "hello" and c.get("nokey") is None
    assert c.set("obj", {"x": [1, 2]}) and c.get("obj") == {"x": [1, 2]}  # pickled, flags say so
    assert c.set("raw", b"\x00\xff") and c.get("raw") == b"\x00\xff" and c.set("i", 7) and c.get("i") == 7
    assert c.get_multi(["a", "i", "nokey"]) == {"a": "hello", "i": 7}
    assert c.add("a", "x") is False and c.replace("nokey", "x") is False and c.add("b", "x")
    value, cas = c.gets("a")
    assert value == "hello" and c.cas("a", "new", cas) and c.cas("a", "newer", cas) is False and c.get("a") == "new"
    assert c.incr("ctr", 5, default=10) == 10 and c.incr("ctr", 5) == 15 and c.decr("ctr", 100) == 0
    assert c.delete("a") and c.get("a") is None and c.delete("a")  # bmemcached: a miss deletes "fine"
    big = os.urandom(NEAR_LIMIT)
    assert c.set("big", big) and c.get("big") == big
    with pytest.raises(bmemcached.exceptions.MemcachedException, match="Too large"):
        c.set("huge", os.urandom(MIB))
    assert c.get("big") == big
    assert c.flush_all() and c.get("b") is None
    (server_stats,) = c.stats().values()
    assert int(server_stats["get_hits"]) > 0 and server_stats["version"]
    c.disconnect_all()


# ---------------------------------------------------------------- libmemcached-tools

def memc(tool, address, *args, binary=False):
    cmd = [tool, f"--servers={address[0]}:{address[1]}", *(["--binary"] if binary else []), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, timeout=60)


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_libmemcached_tools(fresh, tmp_path, binary):
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(300_000))
    assert memc("memccp", fresh, blob, binary=binary).returncode == 0
    out = tmp_path / "out.bin"
    assert memc("memccat", fresh, f"--file={out}", "blob.bin", binary=binary).returncode == 0
    assert out.read_bytes() == blob.read_bytes()
    assert memc("memcexist", fresh, "blob.bin", binary=binary).returncode == 0
    assert memc("memcexist", fresh, "nokey", binary=binary).returncode != 0
    assert memc("memctouch", fresh, "--expire=100", "blob.bin", binary=binary).returncode == 0
    assert memc("memctouch", fresh, "--expire=100", "nokey", binary=binary).returncode != 0
    assert memc("memcrm", fresh, "blob.bin", binary=binary).returncode == 0
    assert memc("memcrm", fresh, "blob.bin", binary=binary).returncode != 0
    assert memc("memccat", fresh, "blob.bin", binary=binary).returncode != 0
    assert memc("memccp", fresh, blob, binary=binary).returncode == 0
    assert memc("memcflush", fresh, binary=binary).returncode == 0
    assert memc("memcexist", fresh, "blob.bin", binary=binary).returncode != 0
    st = memc("memcstat", fresh, binary=binary)
    assert st.returncode == 0 and b"curr_items:" in st.stdout and b"pid:" in st.stdout
    version = memc("memcstat", fresh, "--server-version", binary=binary)
    assert version.returncode == 0 and (version.stdout + version.stderr).startswith(b"%s:%d " % (fresh[0].encode(), fresh[1]))
    assert memc("memcping", fresh).returncode == 0  # memcping has no --binary
    assert memc("memcping", ("127.0.0.1", 1)).returncode != 0


# ---------------------------------------------------------------- sprout.cache over several servers

def test_sprout_cache_module():
    assert sprout.cache.parse_servers("a:1, b:2 c") == [("a", 1), ("b", 2), ("c", 11211)]
    assert sprout.cache.parse_servers(["[::1]:5", ("h", "6")]) == [("::1", 5), ("h", 6)]
    assert sprout.cache.parse_servers(("h", 7)) == [("h", 7)]
    os.environ["SPROUT_CACHE_TEST_SERVERS"] = "x:1,y:2"
    try:
        assert sprout.cache.servers_from_env("SPROUT_CACHE_TEST_SERVERS") == [("x", 1), ("y", 2)]
    finally:
        del os.environ["SPROUT_CACHE_TEST_SERVERS"]
    assert sprout.cache.servers_from_env("SPROUT_CACHE_UNSET_VAR", default="z:3") == [("z", 3)]
    from pymemcache.client.hash import HashClient
    from pymemcache.client.rendezvous import RendezvousHash
    from pymemcache.serde import pickle_serde

    c = sprout.cache.client("h1:1,h2:2")  # connects lazily
    assert isinstance(c, HashClient) and isinstance(c.hasher, RendezvousHash) and sorted(c.clients) == ["h1:1", "h2:2"]
    assert c.use_pooling and not c.ignore_exc and c.default_kwargs["serde"] is pickle_serde
    assert sprout.cache.client("h:1", ignore_exc=True, timeout=9).default_kwargs["timeout"] == 9


def test_consistent_hashing(make_cache_server):
    servers = [make_cache_server("sprout"), make_cache_server("sprout"), make_cache_server("memcached")]
    cache = sprout.cache.client(",".join(s.spec for s in servers))
    keys = [f"user:{i}" for i in range(600)]
    for key in keys:
        assert cache.set(key, {"id": key, "n": len(key)})
    assert cache.get_many(keys) == {key: {"id": key, "n": len(key)} for key in keys}
    counts = [int(s.stats()["curr_items"]) for s in servers]
    assert sum(counts) == 600 and min(counts) >= 140, counts  # spread over all three
    # take the memcached out of the list: only its keys move, every other key still hits
    two = sprout.cache.client([servers[0].spec, servers[1].spec])
    found = two.get_many(keys)
    assert len(found) == 600 - counts[2] and all(found[k] == {"id": k, "n": len(k)} for k in found)
    assert 0.25 < counts[2] / 600 < 0.42


def test_server_dies(make_cache_server):
    """What users get when a server dies (sprout.cache's docstring says so too). With
    ignore_exc=False, the default (here with retry_timeout=0 to be quick), its keys raise the
    connection error (OSError; MemcacheUnexpectedCloseError for a pooled connection it broke)
    for a few calls, until pymemcache takes it out of the ring after `retry_attempts` tries.
    With ignore_exc=True and retry_attempts=0 nothing raises: its keys read as misses, it
    leaves the ring at once, and its keys then live on the other servers."""
    servers = [make_cache_server("sprout"), make_cache_server("sprout"), make_cache_server("memcached")]
    specs = [s.spec for s in servers]
    strict = sprout.cache.client(specs, retry_attempts=1, retry_timeout=0)
    lenient = sprout.cache.client(specs, ignore_exc=True, retry_attempts=0)
    keys = [f"k{i}" for i in range(90)]
    for key in keys:
        assert strict.set(key, key)
    victim = servers[1]
    lost = [k for k in keys if strict.hasher.get_node(k) == victim.spec]
    assert lost and lenient.get_many(keys) == {k: k for k in keys}
    victim.kill()

    errors = 0
    for _ in range(10):  # the broken pooled connection, then refused connects, then out
        try:
            strict.get(lost[0])
            break
        except (OSError, MemcacheError):
            errors += 1
    assert 1 <= errors <= 4 and victim.spec not in strict.hasher.nodes
    assert strict.set(lost[0], "again") and strict.get(lost[0]) == "again"  # its keys go elsewhere

    results = Counter(lenient.get(k) == k for k in keys)  # no exception at all
    assert results[True] == len(keys) - len(lost) and results[False] == len(lost)
    for key in lost:
        assert lenient.set(key, "moved") and lenient.get(key) == "moved"
    assert victim.spec not in lenient.hasher.nodes
