"""A worker for a benchmark driver: started pinned to a CPU with a configuration of the
driver's (its `[worker]` section written here), waited for, stopped and cleaned up after; and
its admin API called with a token or a tenant's key (JSON in and out, lambdas uploaded from a
dict of files)."""

import contextlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

import sprout  # noqa: E402


def wait_started(port, worker, work, seconds, what="the worker"):
    """A client of the worker on `port` once it answers; exit if process `worker` ends or
    `seconds` pass first (its log is in `work`)."""
    client = sprout.Client(f"http://127.0.0.1:{port}", timeout=60)
    deadline = time.time() + seconds
    while True:
        try:
            client.status()
            return client
        except Exception:
            if time.time() > deadline or worker.poll() is not None:
                sys.exit(f"{what} did not start (see {work}/worker.log)")
            time.sleep(0.2)


@contextlib.contextmanager
def running_worker(binary, port, cpu, sections, name):
    """A worker of `binary` on 127.0.0.1:`port`, pinned to `cpu`, configured with `[worker]`
    and the TOML `sections` after it; yields its directory (its token in `api-token`)."""
    work = tempfile.mkdtemp(prefix=f"sprout-{name}-")
    config = f'[worker]\nlisten = "127.0.0.1:{port}"\nname = "{name}-{port}"\nlog = "warn"\n\n{sections}'
    Path(work, "config.toml").write_text(config)
    subprocess.run([binary, "worker", "init", work], check=True, capture_output=True, cwd=REPO)
    log = open(os.path.join(work, "worker.log"), "w")
    worker = subprocess.Popen(["taskset", "-c", str(cpu), binary, "worker", "up", work], stdout=log, stderr=log, cwd=REPO)
    try:
        wait_started(port, worker, work, 120)
        yield work
    finally:
        worker.terminate()
        worker.wait()
        subprocess.run([binary, "worker", "down", work], capture_output=True)


def admin(port, token, method, path, body=None, content_type="application/json"):
    """The JSON answer of an admin request with `token` (the operator's or a tenant's key)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": content_type})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


def upload(port, key, name, files):
    """Upload lambda `name` made of `files` ({path: text}) with `key`."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for path, text in files.items():
            raw = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    admin(port, key, "POST", f"/registry/{name}", data.getvalue(), "application/gzip")
