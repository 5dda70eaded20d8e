"""`watch` and `stats conns` (issue 53; memcached's watcher.t, watcher_connid.t, stats-conns.t):
a connection that asks to watch fetchers, mutations, deletions, evictions or connection events
gets memcached 1.6.45's log lines for every connection's requests, naming each by the socket
`stats conns` lists it under; an unknown kind is ERROR; at most 20 watch at once.
Runs against memcached 1.6.45 too (SPROUT_CACHE_IMPL=memcached SPROUT_MEMCACHED=...)."""

import re
import socket
import time

from cache_servers import exchange, skip_unless_current

TS = r"ts=\d+\.\d+ gid=\d+ "


class Lines:
    """A connection read line by line."""

    def __init__(self, address):
        self.sock = socket.create_connection(address, timeout=5)
        self.file = self.sock.makefile("rb")

    def send(self, data):
        self.sock.sendall(data)

    def line(self):
        return self.file.readline().decode()

    def until(self, pattern, limit=200):
        """The first line matching `pattern` (lines before it are skipped)."""
        for _ in range(limit):
            line = self.line()
            assert line, "the connection closed"
            if re.search(pattern, line):
                return line
        raise AssertionError(f"no line matched {pattern!r}")

    def close(self):
        self.file.close()
        self.sock.close()


def own_fd(client):
    """The socket number `stats conns` shows for `client` (memcached's: the one in
    conn_parse_cmd, the connection asking)."""
    client.send(b"stats conns\r\n")
    lines = []
    while (line := client.line()) != "END\r\n":
        lines.append(line)
    asking = [re.match(r"STAT (\d+):state conn_parse_cmd", x) for x in lines]
    return int(next(m.group(1) for m in asking if m))


def watcher(address, kinds):
    w = Lines(address)
    w.send(b"watch " + kinds + b"\r\n")
    assert w.line() == "OK\r\n"
    return w


def test_fetches_and_stores_are_logged_with_the_connection_that_made_them(sprout_cache_server):
    address = sprout_cache_server
    skip_unless_current(address)
    first = Lines(address)
    first_fd = own_fd(first)
    w = watcher(address, b"fetchers mutations")
    first.send(b"set watched 0 0 5 noreply\r\nhello\r\n")
    # memcached looks the key up before it stores: a miss, then the store.
    assert re.match(TS + rf"type=item_get key=watched status=not_found clsid=0 cfd={first_fd} size=0\n$", w.line())
    assert re.match(TS + rf"type=item_store key=watched status=stored cmd=set ttl=0 clsid=1 cfd={first_fd} size=5\n$", w.line())
    second = Lines(address)
    second_fd = own_fd(second)
    assert second_fd != first_fd
    second.send(b"get watched\r\n")
    assert re.match(TS + rf"type=item_get key=watched status=found clsid=1 cfd={second_fd} size=5\n$", w.until("item_get"))
    # A long key goes URI-encoded.
    key = b"#" * 250
    first.send(b"set " + key + b" 0 0 9\r\nmemcached\r\n")
    assert first.line() == "STORED\r\n"
    store = w.until("item_store")
    assert store.split()[3] == "key=" + "%23" * 250
    for c in (first, second, w):
        c.close()


def test_deletions_and_connection_events(make_cache_server):
    address = make_cache_server("sprout").address  # its own: no other test's connections come and go
    skip_unless_current(address)
    w = watcher(address, b"deletions connevents")
    client = Lines(address)
    client_fd = own_fd(client)
    # (lines about connections of earlier tests may come first)
    assert re.match(TS + rf"type=conn_new rip=127\.0\.0\.1 rport=\d+ transport=tcp cfd={client_fd}\n$", w.until(f"cfd={client_fd}"))
    client.send(b"set gone 0 0 1\r\nx\r\ndelete gone\r\ndelete gone\r\n")
    assert [client.line() for _ in range(3)] == ["STORED\r\n", "DELETED\r\n", "NOT_FOUND\r\n"]
    assert re.match(r"ts=\d+\.\d+ gid=\d+ type=deleted key=gone cmd=delete clsid=1 size=1\n$", w.line())
    client.send(b"quit\r\n")
    assert re.match(TS + rf"type=conn_close rip=127\.0\.0\.1 rport=\d+ transport=tcp reason=normal cfd={client_fd}\n$", w.line())
    rude = Lines(address)
    rude.send(b"GET / HTTP/1.1\r\n")
    assert "type=conn_new" in w.line()
    assert re.search(r"type=conn_close .* reason=error cfd=\d+\n$", w.line())
    for c in (client, rude, w):
        c.close()


def test_evictions_are_logged(make_cache_server):
    server = make_cache_server("sprout", "-m", "8")
    address = server.address
    skip_unless_current(address)
    client = Lines(address)
    value = b"B" * 11000
    client.send(b"".join(b"set fill%d 0 0 11000 noreply\r\n%s\r\n" % (i, value) for i in range(1200)) + b"version\r\n")
    assert client.line().startswith("VERSION")
    w = watcher(address, b"mutations evictions")
    client.send(b"set newest 0 0 11000 noreply\r\n" + value + b"\r\n")
    seen = {w.until(r"type=(eviction|item_store)").split()[2] for _ in range(2)}
    assert seen == {"type=eviction", "type=item_store"}
    for c in (client, w):
        c.close()


def test_watch_refuses_unknown_kinds_and_more_than_twenty(make_cache_server):
    address = make_cache_server("sprout").address  # its own: memcached frees a closed watcher late
    skip_unless_current(address)
    assert exchange(address, b"watch fetchers sideways\r\n", sentinel=False, until=b"\r\n") == b"ERROR\r\n"
    watchers = [watcher(address, b"fetch") for _ in range(20)]  # a prefix names a kind, as memcached reads it
    extra = Lines(address)
    extra.send(b"watch\r\n")
    assert extra.line() == "WATCHER_TOO_MANY log watcher limit reached\r\n"
    watchers.pop().close()
    # A closed watcher's place frees (memcached notices when a line to it fails: make some).
    for _ in range(30):
        exchange(address, b"get nothing\r\n")
        extra.send(b"watch\r\n")
        if extra.line() == "OK\r\n":
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the closed watcher's place never freed")
    for c in watchers + [extra]:
        c.close()


def test_stats_conns_lists_listeners_and_clients_by_state(sprout_cache_server):
    address = sprout_cache_server
    skip_unless_current(address)
    busy = Lines(address)
    busy.send(b"set half 0 0 6\r\nab")  # mid-value: conn_nread
    asking = Lines(address)
    time.sleep(1.1)
    asking.send(b"stats conns\r\n")
    stats = {}
    while (line := asking.line()) != "END\r\n":
        _, name, value = line.split(" ", 2)
        stats[name] = value.strip()
    states = {k.split(":")[0]: v for k, v in stats.items() if k.endswith(":state")}
    listeners = [fd for fd, s in states.items() if s == "conn_listening"]
    assert listeners and all(stats[f"{fd}:addr"] == f"tcp:127.0.0.1:{address[1]}" for fd in listeners), stats
    assert sorted(states.values()).count("conn_parse_cmd") == 1 and "conn_nread" in states.values(), stats
    nread = next(fd for fd, s in states.items() if s == "conn_nread")
    assert stats[f"{nread}:listen_addr"] == f"tcp:127.0.0.1:{address[1]}"
    assert re.match(r"tcp:127\.0\.0\.1:\d+$", stats[f"{nread}:addr"])
    assert int(stats[f"{nread}:secs_since_last_cmd"]) >= 1
    for c in (busy, asking):
        c.close()
