"""A WSGI app that writes a line for every request it begins into a journal on a writable
volume (so a test can count how often a request ran, even when its sandbox died), then does
what the path says: /ok answers, /nap?s=N sleeps N seconds first, /crash ends the sandbox,
/half sends the first bytes of a reply and then ends it, /sleep outlasts any time limit,
/hog passes the memory limit."""

import os
import sys
import time
import uuid
from urllib.parse import parse_qs

JOURNAL = "/srv/sprout-test-rw/journal.log"
SANDBOX = uuid.uuid4().hex[:12]  # tells sandboxes apart: each runs this module after its fork


def record(environ):
    line = f"{environ['REQUEST_METHOD']} {environ['PATH_INFO']} {environ['QUERY_STRING']} {SANDBOX}\n"
    with open(JOURNAL, "a") as journal:
        journal.write(line)


def channel():
    """The helper's socket to the worker (the `sock` its serving loop holds)."""
    frame = sys._getframe()
    while frame is not None:
        if "sock" in frame.f_locals:
            return frame.f_locals["sock"]
        frame = frame.f_back
    raise LookupError("no channel socket on the stack")


def app(environ, start_response):
    record(environ)
    path = environ["PATH_INFO"]
    if path == "/nap":
        time.sleep(float(parse_qs(environ["QUERY_STRING"])["s"][0]))
    elif path == "/crash":
        os._exit(3)
    elif path == "/half":
        channel().sendall(b"\x40\x00")  # two of the eight bytes that begin a reply frame
        os._exit(3)
    elif path == "/sleep":
        time.sleep(3600)
    elif path == "/hog":
        chunks = [bytearray(1 << 20) for _ in range(512)]  # touched: bytearray zero-fills
        del chunks
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [] if environ["REQUEST_METHOD"] == "HEAD" else [SANDBOX.encode()]
