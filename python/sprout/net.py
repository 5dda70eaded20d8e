"""Ports on this host: a free one to listen on, and whether a given one is free."""

import os
import socket

_taken = set()


def free_port(host="127.0.0.1"):
    """A port nothing listens on now: the kernel's choice, or, with $SPROUT_PORTS set to a range
    ("LOW-HIGH"), a free one of that range this process has not handed out before, so that
    processes choosing ports at once, each given a range of its own (the tests, run in
    parallel: tests/conftest.py), never choose the same one. Another process may still take it
    first."""
    span = os.environ.get("SPROUT_PORTS")
    if not span:
        with socket.socket() as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    low, high = (int(p) for p in span.split("-"))
    size = high - low + 1
    start = os.getpid() * 7919 % size  # a child choosing in its parent's range starts elsewhere
    for i in range(size):
        port = low + (start + i) % size
        if port not in _taken and port_is_free(host, port):
            _taken.add(port)
            return port
    raise OSError(f"no free port in SPROUT_PORTS={span}")


def port_is_free(host, port):
    """Whether `port` on `host` can be bound now."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True
