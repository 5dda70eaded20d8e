"""Test helpers for the cache: start and stop real cache servers — Debian's stock memcached and
the Sprout cache (`sprout cache serve`) — each on a free port, and talk raw bytes to them.

Its fixtures reach every test module through conftest's ``pytest_plugins``; its helpers are
imported (tests/ is on sys.path, as for conftest's ``wheels``). ``SPROUT_CACHE_IMPL=memcached`` makes the "sprout" servers stock
memcached too: the suite then checks itself against memcached's real behaviour, and tests
marked ``sprout_only`` (things only the Sprout cache promises) are skipped. ``SPROUT_MEMCACHED`` names
another memcached binary to compare with (say a build of memcached's current release) instead of
Debian's.
"""

import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from conftest import SPROUT, free_port

IMPL = os.environ.get("SPROUT_CACHE_IMPL", "sprout")
assert IMPL in ("sprout", "memcached"), f"SPROUT_CACHE_IMPL={IMPL!r}: use sprout or memcached"
MEMCACHED = os.environ.get("SPROUT_MEMCACHED") or shutil.which("memcached") or "/usr/bin/memcached"
DEFAULTS = {"-m": "64", "-t": "1"}

# memcached's current release: the answers the Sprout cache follows where Debian's 1.6.18 differs.
CURRENT = (1, 6, 45)

RUNNING = set()  # started and not yet stopped: killed at exit if a run is cut short


@atexit.register
def _kill_leftovers():
    for process in list(RUNNING):
        if process.poll() is None:
            process.kill()
            process.wait()


sprout_only = pytest.mark.skipif(IMPL != "sprout", reason="checks the Sprout cache itself (SPROUT_CACHE_IMPL=memcached)")


def size_bytes(text):
    """memcached's -I syntax: bytes, or a number with k/m (KiB, MiB)."""
    text = str(text).lower()
    scale = {"k": 1 << 10, "m": 1 << 20}.get(text[-1:], 1)
    return int(text.rstrip("km")) * scale


class CacheServer:
    """One server process. `kind` is "memcached" or "sprout"; `args` are memcached-style flags
    (``"-c", "32"``) that override the defaults (-m 64 -t 1)."""

    def __init__(self, kind, *args, port=None):
        assert kind in ("memcached", "sprout"), kind
        self.kind = kind
        self.impl = "memcached" if kind == "memcached" or IMPL == "memcached" else "sprout"
        self.flags = dict(DEFAULTS)
        args = [str(a) for a in args]
        for flag, value in zip(args[0::2], args[1::2]):
            self.flags[flag] = value
        self.host, self.port = "127.0.0.1", port or free_port()
        self.process = None
        self.log = ""

    @property
    def address(self):
        return (self.host, self.port)

    @property
    def spec(self):
        return f"{self.host}:{self.port}"

    def command(self):
        flags = [x for pair in self.flags.items() for x in pair]
        if self.impl == "sprout":
            return [str(SPROUT), "cache", "serve", "-l", self.host, "-p", str(self.port), *flags]
        extra = ["-U", "0"]
        if os.geteuid() == 0:
            extra += ["-u", "nobody"]
        # memcached 1.6 refuses an -I below its slab chunk size (512 KiB) unless told a smaller
        # one: 1.6.18 takes half of -I, 1.6.45 one no larger than -I, in KiB
        if "-I" in self.flags and size_bytes(self.flags["-I"]) < (512 << 10):
            limit = size_bytes(self.flags["-I"])
            chunk = max(1, limit >> 10) if memcached_release() >= CURRENT else limit // 2
            extra += ["-o", f"slab_chunk_max={chunk}"]
        return [MEMCACHED, "-l", self.host, "-p", str(self.port), *extra, *flags]

    def start(self, timeout=20):
        if self.impl == "memcached" and not os.path.exists(MEMCACHED):
            pytest.fail("memcached is missing: apt-get install memcached libmemcached-tools")
        if self.impl == "sprout" and not SPROUT.exists():
            pytest.fail(f"{SPROUT} is missing: run `cargo build --release` (or SPROUT_CACHE_IMPL=memcached)")
        self.logfile = tempfile.TemporaryFile()  # a file, not a pipe: a chatty server never blocks
        self.process = subprocess.Popen(self.command(), stdout=self.logfile, stderr=subprocess.STDOUT)
        RUNNING.add(self.process)
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.terminate(signal.SIGKILL)
            raise
        return self

    def wait_ready(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.command()} exited ({self.process.returncode}): {self.read_log()}")
            try:
                if exchange(self.address, b"version\r\n", sentinel=False, quiet=1, until=b"\r\n").startswith(b"VERSION "):
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.command()} did not answer `version` within {timeout} s")

    def stop(self, sig=signal.SIGTERM):
        """Stop the server and check that it exited and let go of its port; its exit code."""
        if self.process is None:
            return None
        code = self.terminate(sig)
        with pytest.raises(OSError):
            socket.create_connection(self.address, timeout=1).close()
        return code

    def terminate(self, sig):
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired as e:
                self.process.kill()
                self.process.wait()
                raise AssertionError(f"{self.impl} on port {self.port} ignored signal {sig}") from e
        self.log = self.read_log()
        RUNNING.discard(self.process)
        code, self.process = self.process.returncode, None
        assert code is not None
        return code

    def read_log(self):
        self.logfile.seek(0)
        return self.logfile.read().decode(errors="replace")

    def kill(self):
        return self.stop(signal.SIGKILL)

    def stats(self):
        return stats(self.address)


def start_server(kind, *args):
    """Start a server, retrying on another port if the free port was taken meanwhile."""
    for attempt in range(3):
        server = CacheServer(kind, *args)
        try:
            return server.start()
        except RuntimeError:
            if attempt == 2:
                raise


# ---------------------------------------------------------------- talking raw bytes

# The longest an answer ended by a `version` sentinel may pause (a step whose data swallows
# the sentinel, as a value's bytes, is sent without one instead).
SENTINEL_WAIT = 10


def exchange(address, data, sentinel=True, quiet=0.3, sock=None, until=None):
    """Send `data` and return everything the server answers, with b"<closed>" appended if it
    closed the connection. Reading stops when the answer ends with `until`; or, with
    `sentinel` (text protocol), a `version` command is sent after `data` and reading stops
    once its answer came (it is removed from the result), waiting up to SENTINEL_WAIT for
    each byte (a loaded host can be slow to answer: a sentinel, not a pause, ends the
    answer); without one, after `quiet` seconds without a byte. `sock`: an open connection."""
    own = sock is None
    s = sock or socket.create_connection(address, timeout=5)
    try:
        if sentinel:
            data += b"version\r\n"
        expected = data.count(b"version\r\n") if sentinel else None
        s.sendall(data)
        s.settimeout(quiet if expected is None else SENTINEL_WAIT)
        out = b""
        while True:
            if until is not None and out.endswith(until):
                return out
            if expected is not None and out.count(b"VERSION ") >= expected and out.endswith(b"\r\n"):
                return out[: out.rindex(b"VERSION ")]
            try:
                chunk = s.recv(1 << 20)
            except TimeoutError:
                return out
            except ConnectionResetError:
                return out + b"<closed>"
            if not chunk:
                return out + b"<closed>"
            out += chunk
    finally:
        if own:
            s.close()



def stats(address, args=b""):
    """`stats [args]` as {name: value (str)}."""
    out = exchange(address, b"stats " + args + b"\r\n" if args else b"stats\r\n", sentinel=False, quiet=5, until=b"END\r\n")
    lines = out.decode().split("\r\n")
    assert lines[-2:] == ["END", ""], out[-200:]
    return {line.split(" ", 2)[1]: line.split(" ", 2)[2] for line in lines[:-2]}




def memcached_release():
    """The (major, minor, patch) of the memcached binary in use (`memcached -V`)."""
    out = subprocess.run([MEMCACHED, "-V"], capture_output=True, text=True, timeout=10).stdout
    return tuple(int(x) for x in re.search(r"(\d+)\.(\d+)\.(\d+)", out).groups())


def version_of(address):
    """A server's (major, minor, patch), from its `version` line."""
    line = exchange(address, b"version\r\n", sentinel=False, quiet=5, until=b"\r\n")
    return tuple(int(x) for x in re.match(rb"VERSION (\d+)\.(\d+)\.(\d+)", line).groups())


def skip_unless_current(address):
    """Skip a check of memcached's current release's answers when run against an older one
    (SPROUT_CACHE_IMPL=memcached with Debian's)."""
    if IMPL == "memcached" and version_of(address) < CURRENT:
        pytest.skip(f"memcached {'.'.join(map(str, version_of(address)))} predates these answers (1.6.45)")


def flush(address):
    assert exchange(address, b"flush_all\r\n", sentinel=False, quiet=5, until=b"\r\n") == b"OK\r\n"


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def memcached_server():
    server = start_server("memcached")
    yield server.address
    server.stop()


@pytest.fixture(scope="module")
def sprout_cache_server():
    server = start_server("sprout")
    yield server.address
    server.stop()


@pytest.fixture
def make_cache_server():
    """make(kind, *flags) -> a started CacheServer of its own, stopped after the test."""
    started = []

    def make(kind, *args):
        server = start_server(kind, *args)
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()
