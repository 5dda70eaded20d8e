"""A throwaway PostgreSQL server from Debian's packages, for tests and benchmarks: a new
cluster in a temporary directory, listening on loopback on a free port, stopped and removed
on exit. Run as root, it runs the server as the ``postgres`` user.

    with TempPostgres() as pg:
        db = sprout.store.open(pg.create_database("test"))
"""

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time

from sprout.net import free_port


def server_binary(name):
    """The newest installed PostgreSQL's `name` (initdb, pg_ctl, ...)."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"PostgreSQL's {name} is not installed (apt-get install postgresql)")
    return found[-1]


class TempPostgres:
    def __init__(self, fsync=True):
        self.fsync = fsync
        self.dir = None
        self.port = None

    def _run(self, *argv):
        user = None
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
        def demote():
            if user is not None:
                os.setgid(user.pw_gid)
                os.setuid(user.pw_uid)
        return subprocess.run(argv, preexec_fn=demote, capture_output=True, text=True, timeout=120)

    def start(self):
        self.dir = tempfile.mkdtemp(prefix="sprout-pg-")
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.dir, user.pw_uid, user.pw_gid)
        data = os.path.join(self.dir, "data")
        out = self._run(server_binary("initdb"), "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C")
        if out.returncode:
            raise RuntimeError(f"initdb failed: {out.stderr or out.stdout}")
        self.port = free_port()
        options = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                   f"-c fsync={'on' if self.fsync else 'off'} -c max_connections=200")
        out = self._run(server_binary("pg_ctl"), "-D", data, "-o", options, "-l", os.path.join(self.dir, "server.log"),
                        "-w", "-t", "60", "start")
        if out.returncode:
            log = open(os.path.join(self.dir, "server.log")).read() if os.path.exists(os.path.join(self.dir, "server.log")) else ""
            raise RuntimeError(f"PostgreSQL did not start: {out.stderr or out.stdout}\n{log[-2000:]}")
        return self

    def url(self, database="postgres"):
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name):
        """A new, empty database; returns its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self):
        if self.dir is None:
            return
        self._run(server_binary("pg_ctl"), "-D", os.path.join(self.dir, "data"), "-m", "fast", "-w", "stop")
        for _ in range(50):
            if not os.path.exists(os.path.join(self.dir, "data", "postmaster.pid")):
                break
            time.sleep(0.1)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
