"""The meta commands as memcached 1.6.45's protocol.txt defines them (issue 53; metaget.t):
mg's vivify (N), recache (R), stale and win flags (X, W, Z), hit-before and last access (h, l),
C with v, E; md's invalidation (I) and value removal (x); ms's I, E, s and c on failure; ma's E,
T and t; me; and flag errors. Runs against memcached 1.6.45 too (SPROUT_CACHE_IMPL=memcached
SPROUT_MEMCACHED=<a 1.6.45 build>); Debian's 1.6.18 predates some of it, and skips."""

import re
import time

import pytest

from cache_servers import exchange, flush, skip_unless_current


@pytest.fixture
def meta(sprout_cache_server):
    skip_unless_current(sprout_cache_server)
    flush(sprout_cache_server)

    def send(line):
        return exchange(sprout_cache_server, line.encode()).decode()

    return send


def flags_of(reply):
    """The flags of a reply line: {letter: token}."""
    return {t[0]: t[1:] for t in reply.split("\r\n")[0].split()[1:] if not t.isdigit()}


def test_vivify_on_miss_gives_one_client_the_win(meta):
    first = meta("mg lazy N30 s t v\r\n")  # (memcached applies N where it stands: before t here)
    assert re.match(r"VA 0 s0 t(29|30) W\r\n\r\n$", first), first
    assert meta("mg lazy s v N30\r\n") == "VA 0 s0 Z\r\n\r\n", "the next one is told another won"
    assert meta("ms lazy 3 T60\r\nnew\r\n") == "HD\r\n"
    assert meta("mg lazy v N30\r\n") == "VA 3\r\nnew\r\n", "a real value ends the race"


def test_recache_wins_once_when_the_ttl_runs_low(meta):
    assert meta("ms r 1 T10\r\nx\r\n") == "HD\r\n"
    assert meta("mg r R30 v\r\n") == "VA 1 W\r\nx\r\n"
    assert meta("mg r R30 v\r\n") == "VA 1 Z\r\nx\r\n"
    assert meta("ms r2 1 T100\r\nx\r\n") == "HD\r\n"
    assert meta("mg r2 R30 v\r\n") == "VA 1\r\nx\r\n", "plenty of TTL left: no win"


def test_invalidation_marks_stale_and_a_stale_set_keeps_it_stale(meta):
    assert meta("ms inv 3 T90\r\nmoo\r\n") == "HD\r\n"
    assert meta("md inv I T30\r\n") == "HD\r\n"
    got = meta("mg inv s t c v\r\n")
    f = flags_of(got)
    assert got.startswith("VA 3 ") and got.endswith("\r\nmoo\r\n") and "X" in f and "W" in f, got
    assert 0 < int(f["t"]) <= 30
    assert meta("ms inv 1 T90 C0\r\nf\r\n") == "EX\r\n", "a mismatched cas without I"
    assert meta("ms inv 1 I T90 C1\r\nf\r\n") == "HD\r\n", "I: an older cas sets the stale item"
    f = flags_of(meta("mg inv t c v\r\n"))
    assert "X" in f and "Z" in f and "W" not in f and 0 < int(f["t"]) <= 30, f
    assert meta(f"ms inv 1 T90 C{f['c']}\r\ng\r\n") == "HD\r\n"
    assert "X" not in flags_of(meta("mg inv v\r\n")), "a good set ends staleness"


def test_md_x_empties_the_value_and_keeps_the_item(meta):
    assert meta("ms mdx 2 T50 F7\r\nmx\r\n") == "HD\r\n"
    assert meta("md mdx x\r\n") == "HD\r\n"
    assert meta("mg mdx v f\r\n") == "VA 0 f0\r\n\r\n"
    assert meta("md nothere x\r\n") == "NF\r\n"


def test_hit_before_and_last_access(meta):
    assert meta("ms h 1\r\nx\r\n") == "HD\r\n"
    assert meta("mg h u h\r\n") == "HD h0\r\n"
    assert meta("mg h h l\r\n") == "HD h0 l0\r\n", "before this read: never hit (u did not count)"
    time.sleep(1.1)
    f = flags_of(meta("mg h h l\r\n"))
    assert f["h"] == "1" and int(f["l"]) >= 1, f


def test_get_with_cas_sends_the_value_only_when_it_changed(meta):
    assert meta("ms c 1\r\nx\r\n") == "HD\r\n"
    cas = flags_of(meta("mg c c\r\n"))["c"]
    assert meta(f"mg c v C{cas}\r\n") == "HD\r\n"
    assert meta(f"mg c v C{int(cas) + 1}\r\n") == "VA 1\r\nx\r\n"


def test_explicit_cas_on_set_get_and_arithmetic(meta):
    assert meta("ms e 1 E973 c\r\nx\r\n") == "HD c973\r\n"
    assert meta("mg ev N30 E555 c\r\n") == "HD c555 W\r\n"
    res = meta("ma n N0 J5 E42 c v\r\n")
    assert res == "VA 1 c42\r\n5\r\n", res
    assert meta("ma n E8765 c v\r\n") == "VA 1 c8765\r\n6\r\n"


def test_set_returns_size_and_zero_cas_on_failure(meta):
    assert meta("ms s 3 s\r\nabc\r\n") == "HD s3\r\n"
    assert meta("ms s 2 MA s\r\nde\r\n") == "HD s5\r\n", "after an append, the whole"
    assert meta("ms s 1 c C1\r\nx\r\n") == "EX c0\r\n"
    assert meta("ms s 1 MX\r\nx\r\n") == "CLIENT_ERROR invalid mode for ms M token\r\n"


def test_arithmetic_ttl(meta):
    assert meta("ma t N0 J1 t v\r\n") == "VA 1 t-1\r\n1\r\n"
    f = flags_of(meta("ma t T100 t\r\n"))
    assert 99 <= int(f["t"]) <= 100, f


def test_misses_echo_opaque_and_key(meta):
    assert meta("mg nokey O123 k v\r\n") == "EN O123 knokey\r\n"
    assert meta("mg nokey q v\r\nmn\r\n") == "MN\r\n"


def test_meta_debug(meta):
    assert meta("me nokey\r\n") == "EN\r\n"
    assert meta("ms dbg 4 T100\r\nabcd\r\n") == "HD\r\n"
    assert re.match(r"ME dbg exp=(99|100) la=0 cas=\d+ fetch=no cls=1 size=66\r\n$", meta("me dbg\r\n"))
    meta("mg dbg v\r\n")
    assert "fetch=yes" in meta("me dbg\r\n")


@pytest.mark.parametrize("line, says", [
    ("mg a v Y\r\n", "CLIENT_ERROR invalid flag"),
    ("mg a 1\r\n", "CLIENT_ERROR invalid flag"),
    ("mg a v !\r\n", "CLIENT_ERROR bad command line format"),
    ("mg a Fabc\r\n", "CLIENT_ERROR bad command line format"),
    ("md a x x\r\n", "CLIENT_ERROR duplicate flag"),
    ("mg a v v\r\n", "CLIENT_ERROR duplicate flag"),
    ("mg a Tabc\r\n", "CLIENT_ERROR bad token in command line format"),
    ("ma a Dxyz\r\n", "CLIENT_ERROR invalid or duplicate flag"),  # ma's words for every flag error
    ("ma a N0 Jxyz\r\n", "CLIENT_ERROR invalid or duplicate flag"),
    ("mg\r\n", "CLIENT_ERROR bad command line format"),
])
def test_bad_flags_are_refused_in_memcacheds_words(meta, line, says):
    assert meta(line) == says + "\r\n"


def test_a_refused_set_discards_its_value_unless_the_tokenizer_refused_it(meta):
    assert meta("ms a 5 Y\r\nhello\r\nmn\r\n") == "CLIENT_ERROR invalid flag\r\nMN\r\n"
    assert meta("ms a 5 !\r\nhello\r\nmn\r\n") == "CLIENT_ERROR bad command line format\r\nERROR\r\nMN\r\n"
