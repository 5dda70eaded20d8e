"""The worker's channel as the helper speaks it: frames, and calls to other lambdas.

Frames go over a Unix socket (or a microVM's vsock): ``<u32 header length><u32 body
length><JSON header><body bytes>`` (little endian). While a handler serves a request, the
lambda may call others through it (``sprout.invoke``, which finds :class:`Calls` as module
``_sprout_sandbox``).

Loaded by the helper by path, as ``_sprout_channel`` (load.py); standard library only.
"""

import json
import socket
import struct
import sys
import threading

SOCKET_PATH = "/host/sprout.sock"
FRAME = struct.Struct("<II")
MAX_HEADER = 1 << 20


def send_frame(sock, header, body=b""):
    head = json.dumps(header, separators=(",", ":")).encode()
    sock.sendall(FRAME.pack(len(head), len(body)) + head + body)


def _recv_exact(sock, n, into=None):
    buf = bytearray(n) if into is None else into
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("worker closed the channel")
        got += k
    return buf


def recv_frame(sock):
    """Read one frame; returns (header, body). The header and body come in one read where
    the worker sent them at once (it does)."""
    head_len, body_len = FRAME.unpack(_recv_exact(sock, FRAME.size))
    if head_len > MAX_HEADER:
        raise ValueError("frame header too large")
    rest = _recv_exact(sock, head_len + body_len)
    body = bytes(rest[head_len:]) if body_len else b""
    return json.loads(rest[:head_len]), body


def connect():
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(SOCKET_PATH)
    return sock


RECONNECT_PAUSE = 0.0005  # seconds between tries to reach the worker from a restored pod


def reconnect():
    """Reach the worker's socket once it is there again: a pod's process that hung up before
    its pod was checkpointed (a host connection cannot be saved) resumes here in the pod
    restored from it, where the worker listens anew."""
    import time

    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(SOCKET_PATH)
            return sock
        except OSError:
            sock.close()
            time.sleep(RECONNECT_PAUSE)


class Calls:
    """What ``sprout.invoke`` reaches (as module ``_sprout_sandbox``): calls to other lambdas,
    made over this sandbox's channel while the handler serves a request. The worker, which is
    waiting for the request's reply, answers each call frame with one frame; calls from several
    threads take turns."""

    def __init__(self, sock):
        self.sock = sock
        self.serving = False
        self.lock = threading.Lock()

    def call(self, name, body, batch=False):
        """Run lambda `name` on the event `body` (JSON); with `batch`, on each event of the JSON
        array `body` (a map: the reply's body is the array of their outcomes). Returns the
        worker's reply frame: (header, body)."""
        header = {"op": "invoke", "lambda": name}
        if batch:
            header["batch"] = True
        with self.lock:
            if not self.serving:
                raise RuntimeError("sprout.invoke can be called only while the lambda serves a request")
            send_frame(self.sock, header, body)
            return recv_frame(self.sock)


def install_calls(sock):
    module = type(sys)("_sprout_sandbox")
    calls = Calls(sock)
    module.call = calls.call
    module.request_id = ""  # the request under way (sprout.request_id())
    sys.modules["_sprout_sandbox"] = module
    return calls, module
