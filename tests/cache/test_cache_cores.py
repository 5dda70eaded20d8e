"""The Sprout cache on several cores: connections spread over the cores' listeners, counters
gathered from every core's Ebb representative, cas values unique across cores, large values
arriving in pieces, and a client that pipelines without reading (backpressure)."""

import os
import socket
import time

from cache_servers import exchange, sprout_only, stats

pytestmark = sprout_only


def connect(address):
    s = socket.create_connection(address)
    s.settimeout(10)
    return s


def read_until(sock, end):
    data = b""
    while not data.endswith(end):
        chunk = sock.recv(1 << 20)
        assert chunk, f"connection closed; got {data[-200:]!r}"
        data += chunk
    return data


def test_counters_are_gathered_from_every_core(make_cache_server):
    server = make_cache_server("sprout", "-t", "2")
    address = server.address
    # Many connections: SO_REUSEPORT spreads them over both cores' listeners.
    socks = [connect(address) for _ in range(24)]
    for i, s in enumerate(socks):
        s.sendall(b"set k%d 0 0 1\r\nx\r\n" % i)
        assert read_until(s, b"\r\n") == b"STORED\r\n"
    for s in socks:
        for i in range(5):
            s.sendall(b"get k%d\r\n" % i)
            assert read_until(s, b"END\r\n").startswith(b"VALUE")
        s.sendall(b"get missing\r\n")
        assert read_until(s, b"END\r\n") == b"END\r\n"
    st = stats(address)
    assert int(st["threads"]) == 2
    assert int(st["cmd_set"]) == 24
    assert int(st["get_hits"]) == 24 * 5
    assert int(st["get_misses"]) == 24
    assert int(st["cmd_get"]) == 24 * 6
    # The 24 clients, plus the one asking for stats.
    assert int(st["curr_connections"]) == 25
    for s in socks:
        s.close()
    deadline = time.time() + 5
    while int(stats(address)["curr_connections"]) != 1 and time.time() < deadline:
        time.sleep(0.05)
    assert int(stats(address)["curr_connections"]) == 1
    # stats reset zeroes every core's counters.
    assert exchange(address, b"stats reset\r\n").startswith(b"RESET")
    st = stats(address)
    assert int(st["cmd_get"]) == 0 and int(st["get_hits"]) == 0
    assert int(st["curr_items"]) == 24, "reset leaves the items alone"


def test_cas_values_are_unique_across_cores(make_cache_server):
    server = make_cache_server("sprout", "-t", "2")
    socks = [connect(server.address) for _ in range(16)]
    for i, s in enumerate(socks):
        for j in range(20):
            s.sendall(b"set c%d_%d 0 0 1\r\nx\r\n" % (i, j))
            assert read_until(s, b"\r\n") == b"STORED\r\n"
    reader = connect(server.address)
    keys = b" ".join(b"c%d_%d" % (i, j) for i in range(16) for j in range(20))
    reader.sendall(b"gets " + keys + b"\r\n")
    reply = read_until(reader, b"END\r\n")
    cas = [line.split()[4] for line in reply.split(b"\r\n") if line.startswith(b"VALUE")]
    assert len(cas) == 320
    assert len(set(cas)) == 320, "two items share a cas value"


def test_a_large_value_arriving_in_pieces(make_cache_server):
    server = make_cache_server("sprout", "-t", "1", "-I", "2m")
    value = bytes(range(256)) * 4000  # 1,024,000 bytes
    s = connect(server.address)
    s.sendall(b"set big 3 0 %d\r\n" % len(value))
    for start in range(0, len(value), 100_000):
        s.sendall(value[start:start + 100_000])
        time.sleep(0.01)
    s.sendall(b"\r\n")
    assert read_until(s, b"\r\n") == b"STORED\r\n"
    s.sendall(b"get big\r\n")
    reply = read_until(s, b"END\r\n")
    assert reply == b"VALUE big 3 %d\r\n" % len(value) + value + b"\r\nEND\r\n"


def test_a_client_that_pipelines_without_reading_is_held_back(make_cache_server):
    server = make_cache_server("sprout", "-t", "1")
    value = b"v" * 100_000
    s = connect(server.address)
    s.sendall(b"set big 0 0 %d\r\n" % len(value) + value + b"\r\n")
    assert read_until(s, b"\r\n") == b"STORED\r\n"
    # 500 gets of 100 KB (50 MB of replies) sent before reading a byte: the server stops
    # reading while replies back up, and the client's sends block rather than fail.
    s.setblocking(False)
    request = b"get big\r\n" * 500
    sent = 0
    deadline = time.time() + 5
    while sent < len(request) and time.time() < deadline:
        try:
            sent += s.send(request[sent:])
        except BlockingIOError:
            time.sleep(0.01)
    s.setblocking(True)
    s.settimeout(20)
    expected = (b"VALUE big 0 %d\r\n" % len(value) + value + b"\r\nEND\r\n") * 500
    received = bytearray()
    while len(received) < len(expected):
        if sent < len(request):
            sent += s.send(request[sent:])
        chunk = s.recv(1 << 20)
        assert chunk, "the server closed the connection"
        received += chunk
    assert bytes(received) == expected
    # Another client was served all along.
    assert exchange(server.address, b"get big\r\n").startswith(b"VALUE big 0 100000")


def cpu_seconds(pid):
    """User and system CPU time a process has used (from /proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def lone_client_round_trips(address, n):
    s = connect(address)
    s.sendall(b"set k 0 0 1\r\nx\r\n")
    assert read_until(s, b"\r\n") == b"STORED\r\n"
    for _ in range(n):
        s.sendall(b"get k\r\n")
        assert read_until(s, b"END\r\n") == b"VALUE k 0 1\r\nx\r\nEND\r\n"
    return s


def test_a_core_polling_for_a_lone_client_sleeps_once_it_goes_quiet(make_cache_server):
    # By default a core polls (up to --lone-spin-us) for the next request of a client that
    # alone keeps it busy; once that client stops asking, the core must sleep again.
    server = make_cache_server("sprout", "-t", "1")
    kept_open = lone_client_round_trips(server.address, 3000)
    polls = core_polls(server.address)
    assert polls["polls_spun_found"] > 0, f"no request was found by polling: {polls}"
    assert polls["polls_slept"] > 0, polls
    time.sleep(0.1)
    before = cpu_seconds(server.process.pid)
    time.sleep(1.0)
    used = cpu_seconds(server.process.pid) - before
    assert used < 0.15, f"the server used {used:.2f} s of CPU in a quiet second"
    kept_open.close()


def test_lone_polling_can_be_turned_off(make_cache_server):
    server = make_cache_server("sprout", "-t", "1", "--lone-spin-us", "0")
    lone_client_round_trips(server.address, 200).close()
    polls = core_polls(server.address)
    assert polls["polls_spun"] == polls["polls_spun_found"] == 0, polls
    assert polls["polls_slept"] >= 200, "each request found the core asleep"


def round_robin_round_trips(address, clients, n):
    socks = [connect(address) for _ in range(clients)]
    for i in range(n):
        s = socks[i % clients]
        s.sendall(b"get k\r\n")
        assert read_until(s, b"END\r\n") == b"END\r\n"
    for s in socks:
        s.close()


def test_a_core_polls_for_as_many_clients_as_poll_clients_says(make_cache_server):
    # Three clients taking turns: by default (a lone client only) the core sleeps between
    # their requests; with --poll-clients 3 it polls for them.
    # (A pause of the test's own of over 2 ms lets a few requests be polled for before the
    # clients count as many again: hence "hardly any" rather than none.)
    lone = make_cache_server("sprout", "-t", "1")
    round_robin_round_trips(lone.address, 3, 3000)
    hardly_any = core_polls(lone.address)["polls_spun_found"]
    assert hardly_any < 300, hardly_any
    few = make_cache_server("sprout", "-t", "1", "--poll-clients", "3")
    round_robin_round_trips(few.address, 3, 3000)
    polled = core_polls(few.address)["polls_spun_found"]
    assert polled > 1000, polled
    four = make_cache_server("sprout", "-t", "1", "--poll-clients", "3")
    round_robin_round_trips(four.address, 4, 3000)
    past_few = core_polls(four.address)["polls_spun_found"]
    assert past_few < 300, f"a fourth client is past the few: {past_few}"


def test_poll_clients_out_of_range_is_refused_before_the_server_starts():
    import subprocess

    from conftest import SPROUT

    for bad in ("0", "1025", "many"):
        done = subprocess.run([str(SPROUT), "cache", "serve", "-p", "0", "--poll-clients", bad],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 2, (bad, done.stderr)
        assert "invalid value" in done.stderr and "--poll-clients" in done.stderr, done.stderr


def core_polls(address):
    """Core 0's poll counts from `stats cores`: slept, spun, spun_found."""
    return {k.split(":", 2)[2]: int(v) for k, v in stats(address, b"cores").items() if k.startswith("core:0:polls_")}


def core_connections(address):
    return [int(v) for k, v in sorted(stats(address, b"cores").items()) if k.endswith(":curr_connections")]


def test_connections_are_spread_evenly_over_the_cores(make_cache_server):
    # The kernel's SO_REUSEPORT hash alone would often leave 3 of 4 (or 11 of 16) on one core.
    server = make_cache_server("sprout", "-t", "2")
    for n in (4, 16):
        socks = [connect(server.address) for _ in range(n)]
        for i, s in enumerate(socks):
            s.sendall(b"set k%d 0 0 1\r\nx\r\n" % i)
            assert read_until(s, b"\r\n") == b"STORED\r\n"
        counts = core_connections(server.address)
        assert len(counts) == 2
        # The asking connection is one of them.
        assert sum(counts) == n + 1 and max(counts) - min(counts) <= 1, counts
        for s in socks:
            s.close()
        deadline = time.time() + 5
        while sum(core_connections(server.address)) != 1 and time.time() < deadline:
            time.sleep(0.05)
        assert sum(core_connections(server.address)) == 1, "closed connections are no longer counted"
