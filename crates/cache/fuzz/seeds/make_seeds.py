#!/usr/bin/env python3
"""Write the seed corpora of the fuzz targets (seeds/<target>/) and the initial replay
corpus of tests/fuzz_regressions/. Run from anywhere: python3 make_seeds.py

Session inputs are [c0, c1, stream...]: c0 & 7 picks the largest chunk (0: whole stream,
1: 1 byte, 2: 2, 3: 7, 4: 64, 5: 512, 6: 4096, 7: 16384), c0 & 8 makes chunks that exact
size, c1 seeds the chunk sizes (see tests/support/fuzz_driver.rs)."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
REGRESSIONS = os.path.join(HERE, "..", "..", "tests", "fuzz_regressions")

WHOLE, ONE, TWO, SEVEN, K64, K512 = 0, 1, 2, 3, 4, 5


def pkt(opcode, key=b"", extras=b"", value=b"", opaque=0, cas=0, bodylen=None, keylen=None, extlen=None):
    body = extras + key + value
    return struct.pack(
        ">BBHBBHIIQ", 0x80, opcode,
        len(key) if keylen is None else keylen,
        len(extras) if extlen is None else extlen,
        0, 0,
        len(body) if bodylen is None else bodylen,
        opaque, cas,
    ) + body


def set_extras(flags=0, exptime=0):
    return struct.pack(">II", flags, exptime)


def incr_extras(delta, initial, exptime):
    return struct.pack(">QQI", delta, initial, exptime)


TEXT_BASIC = (
    b"set foo 5 0 3\r\nbar\r\n"
    b"get foo\r\n"
    b"gets foo missing\r\n"
    b"add foo 0 0 1\r\nx\r\n"
    b"add new 0 0 1 noreply\r\ny\r\n"
    b"replace foo 0 0 4\r\nbaz!\r\n"
    b"append foo 0 0 2\r\n++\r\n"
    b"prepend foo 0 0 2\r\n--\r\n"
    b"cas foo 0 0 3 1\r\nnop\r\n"
    b"set n 0 0 2\r\n10\r\n"
    b"incr n 5\r\n"
    b"decr n 100\r\n"
    b"incr foo 1\r\n"
    b"touch foo 100\r\n"
    b"gat 100 foo n\r\n"
    b"gats 0 foo\r\n"
    b"delete foo\r\n"
    b"delete foo noreply\r\n"
    b"delete n 0\r\n"
    b"mn\r\n"
    b"mg foo v\r\n"
    b"version\r\n"
    b"verbosity 1\r\n"
    b"flush_all 10\r\n"
    b"flush_all noreply\r\n"
    b"stats\r\n"
    b"stats settings\r\n"
    b"stats items\r\n"
    b"stats bogus\r\n"
    b"stats reset\r\n"
    b"bogus command\r\n"
    b"quit\r\n"
    b"get after_quit\r\n"
)

# Meta commands (Zm9v is base64 for "foo").
TEXT_META = (
    b"ms foo 3 T0 F5 c k\r\nbar\r\n"
    b"mg foo v f k c s t\r\n"
    b"mg foo q k O123\r\n"
    b"mg missing v q\r\n"
    b"mg missing v\r\n"
    b"mg foo u v T30\r\n"
    b"ms Zm9v 2 b k c\r\nhi\r\n"
    b"mg Zm9v b v k\r\n"
    b"md Zm9v b k q\r\n"
    b"ma n N0 J10 v\r\n"
    b"ma n D5 MD v c\r\n"
    b"ma n q\r\n"
    b"ma foo\r\n"
    b"ms foo 3 MA\r\nxyz\r\n"
    b"ms foo 3 MP C1\r\nabc\r\n"
    b"ms foo 2 ME\r\nzz\r\n"
    b"ms foo 2 MR I\r\nzz\r\n"
    b"ms foo x\r\n"
    b"ms foo 2 Z\r\nzz\r\n"
    b"ms foo 2 MX\r\nzz\r\n"
    b"ms foo 2\r\nzzzz\r\n"
    b"ms !!!! 2 b\r\nzz\r\n"
    b"md foo k O9\r\n"
    b"md foo\r\n"
    b"mg\r\n"
    b"mn\r\n"
    b"me foo\r\n"
)

BINARY_BASIC = b"".join([
    pkt(0x01, b"foo", set_extras(7, 0), b"bar", opaque=1),
    pkt(0x00, b"foo", opaque=2),
    pkt(0x0C, b"foo", opaque=3),
    pkt(0x09, b"missing", opaque=4),
    pkt(0x0D, b"foo", opaque=5),
    pkt(0x02, b"foo", set_extras(), b"x", opaque=6),
    pkt(0x03, b"foo", set_extras(), b"baz", opaque=7),
    pkt(0x0E, b"foo", b"", b"++", opaque=8),
    pkt(0x0F, b"foo", b"", b"--", opaque=9),
    pkt(0x05, b"n", incr_extras(1, 10, 0), opaque=10),
    pkt(0x05, b"n", incr_extras(5, 0, 0), opaque=11),
    pkt(0x06, b"n", incr_extras(100, 0, 0), opaque=12),
    pkt(0x15, b"m", incr_extras(1, 0, 0xFFFFFFFF), opaque=13),
    pkt(0x1C, b"foo", struct.pack(">I", 100), opaque=14),
    pkt(0x1D, b"foo", struct.pack(">I", 100), opaque=15),
    pkt(0x23, b"foo", struct.pack(">I", 0), opaque=16),
    pkt(0x11, b"q", set_extras(), b"quiet", opaque=17),
    pkt(0x01, b"foo", set_extras(), b"cas", cas=12345, opaque=18),
    pkt(0x04, b"foo", opaque=19),
    pkt(0x14, b"foo", opaque=20),
    pkt(0x0A, opaque=21),
    pkt(0x0B, opaque=22),
    pkt(0x1B, b"", struct.pack(">I", 1), opaque=23),
    pkt(0x10, opaque=24),
    pkt(0x10, b"settings", opaque=25),
    pkt(0x10, b"bogus", opaque=26),
    pkt(0x10, b"reset", opaque=27),
    pkt(0x08, b"", struct.pack(">I", 10), opaque=28),
    pkt(0x18, opaque=29),
    pkt(0x07, opaque=30),
    pkt(0x0A, opaque=31),
])

BIG = bytes((i * 7 + 3) & 0xFF for i in range(17000))

# name -> (ctrl, stream, also a regression?)
SESSION = {
    "text_basic": ([WHOLE, 0], TEXT_BASIC, False),
    "text_basic_bytewise": ([ONE, 0], TEXT_BASIC, True),
    "text_basic_random": ([SEVEN, 42], TEXT_BASIC, False),
    "text_noreply": ([WHOLE, 0], b"set a 0 0 1 noreply\r\na\r\nincr a 1 noreply\r\ntouch a 0 noreply\r\n"
                     b"flush_all 0 noreply\r\nset a 0 0 x noreply\r\nget a\r\n", False),
    # A partial command line, then its end; a partial value, then its end.
    "text_partial": ([TWO, 7], b"se" b"t k 0 0 5\r\nhel" b"lo\r\nget" b" k\r\n", True),
    # A value of more than DIRECT_MIN (16 KiB): read into its own buffer.
    "text_direct_value": ([K512, 1], b"set big 1 0 17000\r\n" + BIG + b"\r\nget big\r\nappend big 0 0 1\r\n!\r\nget big\r\n", True),
    # A direct value whose trailer is wrong.
    "text_direct_bad_chunk": ([K64, 3], b"set big 1 0 17000\r\n" + BIG + b"XX\r\nget big\r\n", True),
    # A direct value cut off mid-way.
    "text_direct_partial": ([K64, 3], b"set big 1 0 17000\r\n" + BIG[:5000], True),
    # Larger than the item max (64 KiB in the driver): refused, swallowed as it arrives.
    "text_oversized": ([K512, 9], b"set huge 0 0 70000\r\n" + b"z" * 3000 + b"\r\nget huge\r\n", True),
    "text_oversized_then_more": ([SEVEN, 1], b"set k 0 0 1\r\nv\r\nset k 0 0 2000000\r\n" + b"w" * 100, True),
    "text_bad_data_chunk": ([WHOLE, 0], b"set k 0 0 3\r\nabcde\r\nget k\r\n", True),
    "text_bad_lengths": ([WHOLE, 0], b"set k 0 0 -1\r\nset k 0 0 4294967298\r\nab\r\nset k 0 0 2147483646\r\n"
                         b"set k 0 0\r\nget " + b"k" * 251 + b"\r\nincr k -1\r\n", True),
    "text_long_get_line": ([K512, 5], b"get " + b"key " * 700, True),
    "text_long_line_closes": ([K512, 5], b"xyz " * 700 + b"\r\nversion\r\n", True),
    "text_http": ([WHOLE, 0], b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", True),
    "text_bare_lf_cr": ([ONE, 0], b"\r\n\n\r\r\nversion\nmn\r\n", True),
    "text_meta": ([WHOLE, 0], TEXT_META, False),
    "text_meta_chunked": ([SEVEN, 3], TEXT_META, True),
    "text_meta_oversized": ([K64, 0], b"ms big 70000 T0\r\n" + b"q" * 1000 + b"\r\nmn\r\n", True),
    "text_many_tokens": ([WHOLE, 0], b"get " + b" ".join(b"k%d" % i for i in range(40)) + b"\r\n", False),
    "binary_basic": ([WHOLE, 0], BINARY_BASIC, False),
    "binary_basic_bytewise": ([ONE, 0], BINARY_BASIC, True),
    "binary_basic_random": ([SEVEN, 99], BINARY_BASIC, False),
    "binary_direct_value": ([K512, 2], pkt(0x01, b"big", set_extras(3, 0), BIG) + pkt(0x0C, b"big"), True),
    "binary_oversized": ([K512, 2], pkt(0x01, b"huge", set_extras(), b"", bodylen=8 + 4 + 100000) + b"y" * 2000
                         + pkt(0x00, b"huge"), True),
    # keylen + extlen > bodylen: "Invalid arguments", then close.
    "binary_bad_bodylen": ([WHOLE, 0], pkt(0x00, b"abc", bodylen=1) + pkt(0x0A), True),
    "binary_key_too_long": ([WHOLE, 0], pkt(0x00, b"k" * 251) + pkt(0x0A), True),
    "binary_set_no_extras": ([WHOLE, 0], pkt(0x01, b"k", b"", b"v") + pkt(0x0A), True),
    "binary_unknown_opcode": ([TWO, 0], pkt(0x7F, b"key", b"ex", b"body") + pkt(0x0A, opaque=5), True),
    "binary_bad_magic_after": ([WHOLE, 0], pkt(0x0A) + b"\x81" + b"\x00" * 23, True),
    "binary_short_header": ([ONE, 0], pkt(0x0A)[:20], True),
}

TEXT_PARSE = {
    "commands": TEXT_BASIC,
    "numbers": b"set k +5 -0 +00012 1\r\ncas k 0 0 1 18446744073709551615\r\nincr k 18446744073709551616\r\n"
               b"gat -2147483649 k\r\nflush_all 4294967296\r\nverbosity x\r\n",
    "spaces": b"   get   a  b   \r\n \r\n\r\nset  k  0  0  1  noreply  \r\n",
    "tokens": b" ".join(b"t%d" % i for i in range(30)) + b"\n" + b"get " + b" ".join(b"k%d" % i for i in range(30)),
    "meta": b"mg key v f t\r\nms key 2 T0\r\nmd key q\r\nma key\r\nmn\r\nme key\r\nmz\r\n",
    "meta_session": TEXT_META,
    "http": b"GET /index.html HTTP/1.1\r\nPOST / HTTP/1.0\r\n",
}

BINARY_HEADER = {
    "get": pkt(0x00, b"foo"),
    "set": pkt(0x01, b"foo", set_extras(1, 2), b"value"),
    "append": pkt(0x0E, b"foo", b"", b"tail"),
    "incr": pkt(0x05, b"n", incr_extras(1, 5, 0)),
    "touch": pkt(0x1C, b"n", struct.pack(">I", 5)),
    "flush": pkt(0x08, b"", struct.pack(">I", 5)),
    "stat": pkt(0x10, b"settings"),
    "noop_version_quit": pkt(0x0A) + pkt(0x0B) + pkt(0x07),
    "bad_bodylen": pkt(0x00, b"abc", bodylen=1),
    "unknown": pkt(0x55, b"k", b"e", b"v"),
    "set_then_get": pkt(0x01, b"k", set_extras(), b"v") + pkt(0x0C, b"k"),
    "oversized": pkt(0x01, b"k", set_extras(), b"", bodylen=0xFFFFFFFF),
}


def write(folder, name, data):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def main():
    for name, (ctrl, stream, regression) in SESSION.items():
        data = bytes(ctrl) + stream
        write(os.path.join(HERE, "session"), name, data)
        if regression:
            write(REGRESSIONS, "seed_" + name, data)
    for name, data in TEXT_PARSE.items():
        write(os.path.join(HERE, "text_parse"), name, data)
    for name, data in BINARY_HEADER.items():
        write(os.path.join(HERE, "binary_header"), name, data)


if __name__ == "__main__":
    main()
