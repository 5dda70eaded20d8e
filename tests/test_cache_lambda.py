"""Functions use the cache tier: a lambda in a real sandbox talks to a real Sprout cache over
the host's loopback (lean sandboxes share the host's network), and what it writes is what
any other client of the cache reads."""

from pymemcache.client.base import Client

from cache_servers import make_cache_server  # noqa: F401  (fixture)

# Standard library only, so the test needs no package index: the memcached text protocol
# spoken by hand (examples/lambdas/visits does the same with pymemcache).
COUNTER = '''
import socket

def f(event):
    with socket.create_connection(("127.0.0.1", event["port"]), timeout=5) as s:
        key = "visits:" + event["page"]
        s.sendall(f"incr {key} 1\\r\\n".encode())
        reply = s.recv(100)
        if reply == b"NOT_FOUND\\r\\n":
            s.sendall(f"add {key} 0 0 1\\r\\n1\\r\\n".encode())
            reply = b"1\\r\\n" if s.recv(100) == b"STORED\\r\\n" else b"race\\r\\n"
        return {"visits": reply.decode().strip()}
'''


def test_a_lambda_counts_in_the_cache(worker, make_cache_server):
    server = make_cache_server("sprout", "-t", "1")
    host, port = server.address
    worker.deploy_source("counter", COUNTER)
    counts = []
    for _ in range(5):
        counts.append(worker.client.run("counter", {"port": port, "page": "home"})["visits"])
    assert counts == ["1", "2", "3", "4", "5"]
    # The count the sandboxes kept is the cache's, for any client.
    assert Client((host, port)).get("visits:home") == b"5"
