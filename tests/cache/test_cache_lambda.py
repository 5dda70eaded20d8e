"""Functions use the cache tier: a lambda in a real sandbox, on a network of its own, talks to a
real Sprout cache that the worker lists as a service (`[[network.allow]]`), and what it writes
is what any other client of the cache reads."""

from pymemcache.client.base import Client

# Standard library only, so the test needs no package index: the memcached text protocol
# spoken by hand (examples/lambdas/visits does the same with pymemcache). The cache is found
# by its service name, as the worker's /etc/hosts and $SPROUT_SERVICE_CACHE give it.
COUNTER = '''
import os
import socket

def f(event):
    host, _, port = os.environ["SPROUT_SERVICE_CACHE"].rpartition(":")
    with socket.create_connection(("cache", int(port)), timeout=5) as s:
        key = "visits:" + event["page"]
        s.sendall(f"incr {key} 1\\r\\n".encode())
        reply = s.recv(100)
        if reply == b"NOT_FOUND\\r\\n":
            s.sendall(f"add {key} 0 0 1\\r\\n1\\r\\n".encode())
            reply = b"1\\r\\n" if s.recv(100) == b"STORED\\r\\n" else b"race\\r\\n"
        return {"visits": reply.decode().strip(), "via": host}
'''


def test_a_lambda_counts_in_the_cache(make_worker, make_cache_server):
    server = make_cache_server("sprout", "-t", "1")
    host, port = server.address
    worker = make_worker(network={"allow": [{"name": "cache", "address": f"{host}:{port}"}]})
    worker.deploy_source("counter", COUNTER)
    replies = [worker.client.run("counter", {"page": "home"}) for _ in range(5)]
    assert [r["visits"] for r in replies] == ["1", "2", "3", "4", "5"]
    # The sandbox reached the cache at the service's virtual address, not the host's.
    assert replies[0]["via"] != host
    # The count the sandboxes kept is the cache's, for any client.
    assert Client((host, port)).get("visits:home") == b"5"
