"""The Sprout cache's answers to memcached's stats groups and admin commands that clients,
monitoring and memcached's own t/*.t files read (issue 53): `stats slabs` and `stats items` in
memcached 1.6's slab classes (issue_29.t, issue_42.t, issue_163.t, slabs-cas.t), `stats detail`
(stats-detail.t), `stats cachedump` (stats.t), and `slabs automove|reassign` (strtol-testing.t).
Sprout's store keeps no slab pages: each item is counted in the class memcached would give it.
"""

import socket
import struct
import time

from cache_servers import exchange, flush, skip_unless_current, sprout_only, stats

FMT = b"CLIENT_ERROR bad command line format\r\n"


def test_items_are_counted_in_memcacheds_slab_classes(sprout_cache_server):
    address = sprout_cache_server
    skip_unless_current(address)  # 1.6.18 still counts flushed items until its crawler comes
    flush(address)
    assert exchange(address, b"set issue29 0 0 0\r\n\r\n") == b"STORED\r\n"
    slabs = stats(address, b"slabs")
    assert (slabs["1:chunk_size"], slabs["1:used_chunks"], slabs["1:cmd_set"]) == ("96", "1", "1")
    assert exchange(address, b"set issue29_b 0 0 0\r\n\r\n") == b"STORED\r\n"
    assert stats(address, b"slabs")["1:used_chunks"] == "2"
    # Ten 10-byte values: what they request lies between their headers and their chunks.
    flush(address)
    for k in range(10):
        assert exchange(address, b"set key%d 0 0 10\r\nBBBBBBBBBB\r\n" % k) == b"STORED\r\n"
    items = stats(address, b"items")
    assert items["items:1:number"] == "10" and 500 < int(items["items:1:mem_requested"]) < 960, items
    # A 66560-byte value goes in class 31, as in memcached; gets and deletes are counted there.
    assert exchange(address, b"set big 0 0 66560\r\n" + b"A" * 66560 + b"\r\n") == b"STORED\r\n"
    exchange(address, b"get big\r\ndelete key0\r\n")
    slabs = stats(address, b"slabs")
    assert (slabs["31:chunk_size"], slabs["31:used_chunks"], slabs["31:get_hits"]) == ("82792", "1", "1")
    assert slabs["1:delete_hits"] == "1" and int(slabs["active_slabs"]) == 2, slabs
    assert stats(address, b"items")["items:31:number"] == "1"


def test_an_expired_item_replaced_is_reclaimed_in_its_class(sprout_cache_server):
    address = sprout_cache_server
    flush(address)
    assert exchange(address, b"set key 0 1 66560\r\n" + b"A" * 66560 + b"\r\n") == b"STORED\r\n"
    time.sleep(2.2)
    assert exchange(address, b"set key 0 0 66570\r\n" + b"B" * 66570 + b"\r\n") == b"STORED\r\n"
    items = stats(address, b"items")
    assert items["items:31:reclaimed"] == "1" and items["items:31:expired_unfetched"] == "1", items
    # stats reset zeroes the counters, not what is held.
    assert exchange(address, b"stats reset\r\n") == b"RESET\r\n"
    items = stats(address, b"items")
    assert items["items:31:reclaimed"] == "0" and items["items:31:number"] == "1"


def test_stats_detail_counts_by_prefix_while_on(sprout_cache_server):
    address = sprout_cache_server
    flush(address)
    assert exchange(address, b"stats detail dump\r\n") == b"END\r\n"
    assert exchange(address, b"stats detail on\r\n") == b"OK\r\n"
    exchange(address, b"set foo:123 0 0 6\r\nfooval\r\nget foo:123 foo:124\r\ndelete foo:125\r\nset plain 0 0 1\r\nx\r\n")
    assert exchange(address, b"stats detail dump\r\n") == b"PREFIX foo get 2 hit 1 set 1 del 1\r\nEND\r\n"
    assert exchange(address, b"stats reset\r\nstats detail dump\r\n") == b"RESET\r\nEND\r\n"
    assert exchange(address, b"stats detail off\r\n") == b"OK\r\n"
    exchange(address, b"get foo:123\r\n")
    assert exchange(address, b"stats detail dump\r\n") == b"END\r\n"
    assert exchange(address, b"stats detail sideways\r\n") == b"CLIENT_ERROR usage: stats detail on|off|dump\r\n"


@sprout_only  # memcached 1.6 dumps only its cold LRU: new items are not listed at once
def test_stats_cachedump_lists_a_class(sprout_cache_server):
    address = sprout_cache_server
    flush(address)
    exchange(address, b"set foo 0 0 3\r\nbar\r\nset soon 0 100 1\r\nx\r\n")
    dump = exchange(address, b"stats cachedump 1 100\r\n").decode()
    lines = dump.split("\r\n")
    assert lines[-2:] == ["END", ""] and "ITEM foo [3 b; 0 s]" in lines, dump
    soon = next(line for line in lines if line.startswith("ITEM soon"))
    assert abs(int(soon.split("; ")[1].split()[0]) - (time.time() + 100)) < 5, soon
    assert exchange(address, b"stats cachedump 1 1\r\n").count(b"ITEM ") == 1
    assert exchange(address, b"stats cachedump 0 1\r\n") == b"CLIENT_ERROR Illegal slab id\r\n"
    assert exchange(address, b"stats cachedump x 1\r\n") == FMT


@sprout_only  # memcached answers NOSPARE for a class without a free page; Sprout has no pages
def test_slabs_commands_answer_as_memcacheds(sprout_cache_server):
    address = sprout_cache_server
    assert exchange(address, b"verbosity invalid\r\nslabs automove invalid\r\n") == FMT * 2
    assert exchange(address, b"slabs automove 1\r\nslabs automove 0\r\nslabs automove 9\r\n") == b"OK\r\nOK\r\nERROR\r\n"
    assert exchange(address, b"slabs automove window 2\r\n") == b"CLIENT_ERROR automove window too low or too high\r\n"
    assert exchange(address, b"slabs reassign 31 5\r\n") == b"OK\r\n"
    assert exchange(address, b"slabs reassign 5 5\r\n") == b"SAME src and dst class are identical\r\n"
    assert exchange(address, b"slabs reassign 1 99\r\n") == b"BADCLASS invalid src or dst class id\r\n"
    assert exchange(address, b"slabs reassign a b\r\nslabs\r\n") == FMT + b"ERROR\r\n"


def binary_stats(address, group):
    """A binary STAT with `group` as its key: [(status, key, value)] up to the empty packet."""
    key = group.encode()
    packet = struct.pack(">BBHBBHIIQ", 0x80, 0x10, len(key), 0, 0, 0, len(key), 7, 0) + key
    with socket.create_connection(address, timeout=5) as s:
        s.sendall(packet)
        stream, got = s.makefile("rb"), []
        while True:
            _, _, keylen, extlen, _, status, total, _, _ = struct.unpack(">BBHBBHIIQ", stream.read(24))
            body = stream.read(total)
            got.append((status, body[extlen:extlen + keylen].decode(), body[extlen + keylen:].decode()))
            if status != 0 or keylen == 0:
                return got


def test_binary_stat_groups_answer(sprout_cache_server):
    address = sprout_cache_server
    settings = {k: v for _, k, v in binary_stats(address, "settings")[:-1]}
    assert (settings["domain_socket"], settings["evictions"], settings["cas_enabled"]) == ("NULL", "on", "yes")
    for group in ("slabs", "items", "detail on", "detail off"):
        assert binary_stats(address, group)[-1] == (0, "", ""), group
    assert binary_stats(address, "detail on") == [(0, "", "")]
    exchange(address, b"set pre:1 0 0 1\r\nx\r\n")
    dumped = binary_stats(address, "detail dump")
    assert dumped[0] == (0, "detailed", "PREFIX pre get 0 hit 0 set 1 del 0\r\nEND\r\n"), dumped
    assert binary_stats(address, "detail off") == [(0, "", "")]
    assert binary_stats(address, "nosuch")[0][0] == 1  # key not found


def test_general_stats_carry_memcacheds_other_counters(sprout_cache_server):
    """stats.t reads these from a fresh server: present, and zero where nothing happened."""
    address = sprout_cache_server
    general = stats(address)
    for name in ("listen_disabled_num", "time_in_listen_disabled_us", "lrutail_reflocked", "store_no_memory", "store_too_large",
                 "auth_cmds", "auth_errors", "conn_yields", "log_watcher_skipped"):
        assert general[name] == "0", name
    assert int(general["connection_structures"]) >= 2  # the listener and this connection
    settings = stats(address, b"settings")
    assert (settings["auth_enabled_sasl"], settings["shutdown_command"]) == ("no", "no")


@sprout_only  # memcached's crawler runs when its maintainer schedules it, not each second
def test_the_crawler_frees_an_expired_item_nobody_reads(sprout_cache_server):
    address = sprout_cache_server
    flush(address)
    before = stats(address)
    assert exchange(address, b"set soon 0 1 1\r\nx\r\nset stays 0 0 1\r\ny\r\n") == b"STORED\r\n" * 2
    deadline = time.time() + 10
    while time.time() < deadline:
        after = stats(address)
        if int(after["crawler_reclaimed"]) > int(before["crawler_reclaimed"]):
            break
        time.sleep(0.25)
    assert int(after["crawler_reclaimed"]) == int(before["crawler_reclaimed"]) + 1, after
    assert after["curr_items"] == "1" and int(after["crawler_items_checked"]) > int(before["crawler_items_checked"])
