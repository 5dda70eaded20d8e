"""The Sprout cache under bad input and at its limits: the connection limit (-c), the item size
limit (-I), stalled and garbage-sending clients, over-long lines, LRU eviction in a small cache
(-m 2), and a restart on the same port. The expectations are stock memcached 1.6's, checked
against it with SPROUT_CACHE_IMPL=memcached.
"""

import os
import random
import socket
import struct
import time

from cache_servers import CacheServer, exchange, sprout_only

TOO_MANY = b"ERROR Too many open connections\r\n"
TOO_LARGE = b"SERVER_ERROR object too large for cache\r\n"
CLOSED = b"<closed>"


def read_all(sock, quiet=0.3):
    """Whatever arrives until `quiet` seconds pass without a byte, + CLOSED if it closed."""
    sock.settimeout(quiet)
    out = b""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except TimeoutError:
            return out
        except ConnectionResetError:
            return out + CLOSED
        if not chunk:
            return out + CLOSED
        out += chunk


def open_until_refused(address, most):
    """Open connections until the server refuses one. memcached accepts, writes TOO_MANY and
    closes without being asked anything, so each new connection first waits a moment."""
    accepted = []
    for _ in range(most):
        s = socket.create_connection(address, timeout=5)
        first = read_all(s, quiet=0.15)
        if first:
            s.close()
            return accepted, first
        answer = exchange(None, b"version\r\n", sentinel=False, sock=s, quiet=5, until=b"\r\n")
        if answer.startswith(TOO_MANY):  # the refusal came late
            s.close()
            return accepted, TOO_MANY + CLOSED
        assert answer.startswith(b"VERSION "), "an accepted connection must work"
        accepted.append(s)
    return accepted, b""


# ---------------------------------------------------------------- -c: the connection limit

def test_connection_limit(make_cache_server):
    # memcached's -c is really a file descriptor limit: -c 24 leaves ~11 client connections
    # (stdio, listeners, event pipes take the rest); -c 10 does not even start.
    server = make_cache_server("sprout", "-c", "24")
    accepted, refusal = open_until_refused(server.address, 40)
    try:
        assert refusal == TOO_MANY + CLOSED  # the exact line, then the close
        assert 0 < len(accepted) <= 24
        accepted[0].sendall(b"stats\r\n")
        time.sleep(0.2)
        lines = dict(line.split(b" ")[1:3] for line in read_all(accepted[0]).split(b"\r\n") if line.startswith(b"STAT "))
        assert int(lines[b"rejected_connections"]) >= 1 and int(lines[b"curr_connections"]) == len(accepted)
        for s in accepted[:2]:  # room again once clients leave
            s.close()
        deadline = time.time() + 3
        while True:
            more, refusal = open_until_refused(server.address, 1)
            if more or time.time() > deadline:
                break
        assert len(more) == 1 and refusal == b""
        accepted[2:] += more
    finally:
        for s in accepted:
            s.close()


@sprout_only
def test_connection_limit_counts_clients(make_cache_server):
    """The Sprout cache's -c counts client connections: exactly that many are served."""
    server = make_cache_server("sprout", "-c", "5")
    accepted, refusal = open_until_refused(server.address, 10)
    for s in accepted:
        s.close()
    assert (len(accepted), refusal) == (5, TOO_MANY + CLOSED)


# ---------------------------------------------------------------- -I: the item size limit

def test_oversized_value_refused(make_cache_server):
    server = make_cache_server("sprout", "-I", "1k")
    with socket.create_connection(server.address, timeout=5) as s:
        for size in (2000, 2 << 20):  # data swallowed whole, the connection goes on
            s.sendall(b"set big 0 0 %d\r\n%s\r\nset ok 0 0 500\r\n%s\r\nget big\r\n" % (size, b"x" * size, b"y" * 500))
            assert exchange(None, b"", sock=s, quiet=3) == TOO_LARGE + b"STORED\r\nEND\r\n"
        assert exchange(None, b"get ok\r\n", sock=s) == b"VALUE ok 0 500\r\n" + b"y" * 500 + b"\r\nEND\r\n"
    with socket.create_connection(server.address, timeout=5) as s:  # binary: status 0x0003 "Too large."
        extras = struct.pack(">II", 0, 0)
        s.sendall(struct.pack(">BBHBBHIIQ", 0x80, 0x01, 3, 8, 0, 0, 8 + 3 + 2000, 7, 0) + extras + b"big" + b"x" * 2000
                  + struct.pack(">BBHBBHIIQ", 0x80, 0x0A, 0, 0, 0, 0, 0, 8, 0))
        time.sleep(0.2)
        out = read_all(s)
        assert struct.unpack(">BBHBBHIIQ", out[:24])[:7] == (0x81, 0x01, 0, 0, 0, 3, len(b"Too large."))
        assert out[24:34] == b"Too large." and out[34:58] == struct.pack(">BBHBBHIIQ", 0x81, 0x0A, 0, 0, 0, 0, 0, 8, 0)


# ---------------------------------------------------------------- stalled and garbage-sending clients

def test_stalled_client_blocks_nobody(sprout_cache_server):
    stalled = [socket.create_connection(sprout_cache_server, timeout=5) for _ in range(3)]
    stalled[0].sendall(b"set half 0 0 10\r\nabc")  # half a data block
    stalled[1].sendall(b"get hal")  # half a command line
    stalled[2].sendall(b"\x80\x00\x00\x04")  # half a binary header
    start = time.time()
    for i in range(20):
        assert (exchange(sprout_cache_server, b"set k%d 0 0 1\r\nx\r\nget k%d\r\n" % (i, i))
                == b"STORED\r\nVALUE k%d 0 1\r\nx\r\nEND\r\n" % i)
    assert time.time() - start < 5
    assert exchange(None, b"defghij\r\nget half\r\n", sock=stalled[0]) == b"STORED\r\nVALUE half 0 10\r\nabcdefghij\r\nEND\r\n"
    assert exchange(None, b"f\r\n", sock=stalled[1]) == b"VALUE half 0 10\r\nabcdefghij\r\nEND\r\n"
    for s in stalled:
        s.close()


def test_garbage_gets_errors(memcached_server, sprout_cache_server):
    """Random lines get the same answers as from memcached (ERROR), and the connection lives."""
    rng = random.Random(7)
    for _ in range(5):
        lines = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))).replace(b"\n", b"") for _ in range(20)]
        data = b"\r\n".join(b"x" + line for line in lines) + b"\r\n"
        ours, theirs = (exchange(a, data) for a in (memcached_server, sprout_cache_server))
        assert theirs == ours and ours.count(b"ERROR\r\n") == 20
    for address in (memcached_server, sprout_cache_server):
        with socket.create_connection(address, timeout=5) as s:
            assert exchange(None, b"set a b c d\r\nget a b c d e f g h i j k l m n o p q r s t u v w x y z\r\n", sock=s) == \
                b"CLIENT_ERROR bad command line format\r\nEND\r\n"  # the next line is read as a command
            assert exchange(None, b"set \xff 0 0 1\r\nx\r\nget \xff\r\n", sock=s) == b"STORED\r\nVALUE \xff 0 1\r\nx\r\nEND\r\n"


def test_long_line_closes_only_that_connection(sprout_cache_server):
    # memcached: more than 2048 bytes without a newline (unless the line starts with get/gets,
    # which may be long) and the connection is closed without an answer
    other = socket.create_connection(sprout_cache_server, timeout=5)
    for junk in (b"x" * 2049, b"set k 0 0 1" + b" " * 3000, b"x" * 100000):
        with socket.create_connection(sprout_cache_server, timeout=5) as s:
            try:
                s.sendall(junk)
            except OSError:  # closed before it all went
                continue
            assert read_all(s, quiet=2) == CLOSED
    with socket.create_connection(sprout_cache_server, timeout=5) as s:
        s.sendall(b"gets " + b"k " * 5000)  # a long multi-get line is not cut
        assert exchange(None, b"\r\n", sock=s) == b"END\r\n"
    assert exchange(None, b"version\r\n", sentinel=False, sock=other).startswith(b"VERSION ")
    other.close()


def test_binary_garbage_closes(memcached_server, sprout_cache_server):
    for address in (memcached_server, sprout_cache_server):
        with socket.create_connection(address, timeout=5) as s:  # a binary connection, then bad magic
            s.sendall(struct.pack(">BBHBBHIIQ", 0x80, 0x0A, 0, 0, 0, 0, 0, 1, 0) + b"\x42" * 24)
            out = read_all(s, quiet=2)
            assert out == struct.pack(">BBHBBHIIQ", 0x81, 0x0A, 0, 0, 0, 0, 0, 1, 0) + CLOSED


# ---------------------------------------------------------------- -m: LRU eviction

def test_lru_eviction(make_cache_server):
    server = make_cache_server("sprout", "-m", "2")
    values = {b"key%03d" % i: os.urandom(100 << 10) for i in range(100)}  # 10 MiB into 2 MiB
    with socket.create_connection(server.address, timeout=10) as s:
        f = s.makefile("rb")
        for key, value in values.items():
            s.sendall(b"set %s 0 0 %d\r\n%s\r\n" % (key, len(value), value))
            assert f.readline() == b"STORED\r\n"  # a cache evicts; it does not refuse
    st = server.stats()
    assert int(st["evictions"]) > 0 and int(st["limit_maxbytes"]) == 2 << 20
    assert 0 < int(st["bytes"]) <= int(st["limit_maxbytes"]) and int(st["curr_items"]) < 100
    assert int(st["total_items"]) == 100
    for key in list(values)[-5:]:  # the most recent ones survive
        assert exchange(server.address, b"get %s\r\n" % key) == b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (key, 100 << 10, values[key])
    assert exchange(server.address, b"get key000\r\n") == b"END\r\n"


# ---------------------------------------------------------------- restart

def test_restart_on_same_port(make_cache_server):
    first = make_cache_server("sprout")
    assert exchange(first.address, b"set k 0 0 1\r\nx\r\n") == b"STORED\r\n"
    first.stop()  # SIGTERM: exits, frees the port (checked by stop)
    again = CacheServer("sprout", port=first.port).start()
    try:
        assert exchange(again.address, b"get k\r\nset k 0 0 1\r\ny\r\nget k\r\n") == b"END\r\nSTORED\r\nVALUE k 0 1\r\ny\r\nEND\r\n"
        assert again.stats()["curr_items"] == "1"
    finally:
        code = again.stop()
    assert code == 0, f"exit code {code} on SIGTERM (memcached exits 0)"
