"""The state directory of one deployment: its layout, its record, its lock and its secrets.

The record (deploy.json) says how it was started; the lock keeps two commands from acting on
it at once."""

import contextlib
import fcntl
import json
import os
import secrets
from pathlib import Path

from .procs import DeployError


class State:
    """STATE/: pg/ (the PostgreSQL cluster), files/ (the file store, unless --files), conf/
    (generated configuration), logs/, run/ (pid files and sockets), worker/ (the Sprout
    worker's directory), lambda/ (the Olio lambda as deployed), secrets/."""

    def __init__(self, path):
        self.dir = Path(path).resolve()
        self.pg = self.dir / "pg"
        self.files = self.dir / "files"
        self.conf = self.dir / "conf"
        self.logs = self.dir / "logs"
        self.run = self.dir / "run"
        self.worker = self.dir / "worker"
        self.lambda_dir = self.dir / "lambda"
        self.secrets = self.dir / "secrets"
        self.record_path = self.dir / "deploy.json"

    def prepare(self):
        """Make the directories (others may pass through STATE: PostgreSQL, nginx and the
        app run as their own users)."""
        for d in (self.dir, self.conf, self.logs, self.run):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o755)
        self.secrets.mkdir(mode=0o700, exist_ok=True)

    @contextlib.contextmanager
    def lock(self):
        """Hold STATE's lock, or refuse at once if another command holds it."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "deploy.lock", "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise DeployError(f"another olio_deploy command is working on {self.dir}; wait for it") from None
            yield

    def record(self):
        """What `up` recorded (settings, ports), or None if nothing was ever started here."""
        try:
            return json.loads(self.record_path.read_text())
        except FileNotFoundError:
            return None
        except ValueError as e:
            raise DeployError(f"{self.record_path} is damaged ({e}); remove it after checking that nothing runs") from None

    def save_record(self, record):
        tmp = self.record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.record_path)

    def secret(self, name):
        """A random token made once for this deployment and kept in secrets/<name> (0600)."""
        path = self.secrets / name
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            value = path.read_text().strip()
            if value:
                return value
            raise DeployError(f"{path} is empty; remove it to make a new one") from None
        with os.fdopen(fd, "w") as f:
            value = secrets.token_urlsafe(32)
            f.write(value + "\n")
        return value
