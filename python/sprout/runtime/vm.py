"""The vm role: a microVM's only program, which receives its lambda's code and serves it.

It warms up as a Zygote would, waits for the worker on vsock, receives the lambda's code
into /handler, then serves as a handler over vsock.

Loaded by the helper by path, as ``_sprout_vm`` (load.py); standard library only.
"""

import os
import socket

import _sprout_load as load

channel = load.runtime_module("channel")
handler = load.runtime_module("handler")
zygote = load.runtime_module("zygote")

VSOCK_PORT = 1024
MAX_CODE_FILES = 10000


def receive_code(sock):
    """A microVM's first frame: ``{"op": "code", "files": [[path, size, mode], ...]}`` with the
    files' contents one after another as its body, written under /handler (a tmpfs)."""
    order, body = channel.recv_frame(sock)
    if order.get("op") != "code":
        raise ValueError(f"expected the lambda's code, got {order.get('op')!r}")
    files = order.get("files") or []
    if len(files) > MAX_CODE_FILES:
        raise ValueError("too many code files")
    offset = 0
    root = os.path.realpath(load.HANDLER_DIR)
    for path, size, mode in files:
        target = os.path.realpath(os.path.join(root, path))
        if not target.startswith(root + "/") or size < 0 or offset + size > len(body):
            raise ValueError(f"bad code file entry {path!r}")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as out:
            out.write(body[offset:offset + size])
        os.chmod(target, mode & 0o755)
        offset += size


def serve_vm():
    """The helper of a microVM: init (crates/vmm/guest/init.c) starts it as the guest's only
    program. It warms up as a Zygote would, then waits on vsock for the worker (a VM restored
    from a snapshot resumes here, already warm); the first frame is the lambda's code, and
    from then on it is a handler, over vsock instead of a Unix socket."""
    import gc

    listener = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    listener.bind((socket.VMADDR_CID_ANY, VSOCK_PORT))
    listener.listen(1)
    zygote.warm_up()
    gc.collect()
    gc.freeze()
    print("sprout-helper: ready", flush=True)
    sock, _ = listener.accept()
    listener.close()
    receive_code(sock)
    handler.serve_lambda(sock)
