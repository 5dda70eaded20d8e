"""Ports on this host: a free one to listen on, and whether a given one is free."""

import socket


def free_port(host="127.0.0.1"):
    """A port nothing listens on now (the kernel's choice; another process may take it first)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(host, port):
    """Whether `port` on `host` can be bound now."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True
