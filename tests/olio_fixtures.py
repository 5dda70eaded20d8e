"""Fixtures for Olio's functional tests: real Olio sites (gunicorn serving `olio.wsgi:app` over
SQLite or a real PostgreSQL, with or without a real cache server) and a browser-like client.

`olio_site` is parametrized over STACKS; a deployment is added by naming it there and
teaching `start_site` to start it. The fixtures reach every test module through conftest's
``pytest_plugins``; the helpers are imported (``from olio_fixtures import ...``).
"""

import io
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import requests
from PIL import Image

from conftest import ROOT, free_port

# gunicorn alone over SQLite or PostgreSQL (quick), and the two real deployments of
# olio_deploy: the Olio lambda on a Sprout worker, and nginx + gunicorn + memcached, each with
# its own PostgreSQL, confined to CPU 0.
STACKS = ["gunicorn-sqlite", "gunicorn-postgres", "sprout", "conventional"]
DEPLOYMENTS = ("sprout", "conventional")
APP_PATH = f"{ROOT / 'python'}{os.pathsep}{ROOT / 'apps' / 'olio'}"
sys.path.insert(0, str(ROOT / "apps" / "olio"))
GUNICORN = [sys.executable, "-m", "gunicorn"]


class Gunicorn:
    """`gunicorn olio.wsgi:app` on a free port with Olio's settings in its environment."""

    def __init__(self, db_url, files, cache="", secret="", workers=2):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "PYTHONPATH": APP_PATH, "OLIO_DB": db_url, "OLIO_FILES": str(files),
                    "OLIO_CACHE": cache, "OLIO_SECRET": secret, "OLIO_CONFIG": os.devnull}
        self.workers = workers
        self.process = None
        self.log = tempfile.TemporaryFile()

    def start(self, timeout=30):
        argv = [*GUNICORN, "--bind", f"127.0.0.1:{self.port}", "--workers", str(self.workers),
                "--no-control-socket", "--graceful-timeout", "5", "olio.wsgi:app"]
        self.process = subprocess.Popen(argv, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited ({self.process.returncode}):\n{self.read_log()}")
            try:
                if requests.get(self.url + "/", timeout=5).status_code == 200:
                    return self
            except requests.ConnectionError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"gunicorn did not answer within {timeout} s:\n{self.read_log()}")

    def read_log(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


class Site:
    """A running Olio: its URL, database URL and file store, and how to stop it."""

    def __init__(self, url, db_url, files, stop):
        self.url, self.db_url, self.files, self._stop = url, db_url, Path(files), stop

    def browser(self):
        return Browser(self.url)

    def stop(self):
        self._stop()


_databases = iter(range(1, 1 << 30))


def database_url(request, stack, tmp_path):
    if stack in DEPLOYMENTS:
        return None  # the deployment brings its own PostgreSQL
    if stack.endswith("postgres"):
        return request.getfixturevalue("postgres").create_database(f"olio{os.getpid()}_{next(_databases)}")
    return f"sqlite:///{tmp_path}/olio.db"


def start_deployment(stack, cache=True):
    """`olio_deploy.running(stack)` in a state directory other users can enter (the sandbox
    and www-data users reach the file store there), as a Site whose stop takes it down."""
    import olio_deploy

    state = Path(tempfile.mkdtemp(prefix=f"olio-{stack}-", dir="/tmp"))
    state.chmod(0o755)
    context = olio_deploy.running(stack, state / "state", cpus="0", cache=cache)
    deployed = context.__enter__()

    def stop():
        try:
            context.__exit__(None, None, None)
        finally:
            shutil.rmtree(state, ignore_errors=True)

    return Site(deployed.url, deployed.db_url, deployed.files, stop), deployed


def start_site(stack, db_url, files, cache="", secret=""):
    if stack in DEPLOYMENTS:
        return start_deployment(stack)
    if not stack.startswith("gunicorn-"):
        raise ValueError(f"unknown Olio stack {stack!r}")
    server = Gunicorn(db_url, files, cache=cache, secret=secret).start()
    return Site(server.url, db_url, files, server.stop), server


@pytest.fixture(scope="module", params=STACKS)
def olio_site(request, tmp_path_factory):
    """A running Olio of each stack (the module's tests run once per stack), empty at first."""
    tmp = tmp_path_factory.mktemp("olio")
    site, server = start_site(request.param, database_url(request, request.param, tmp), tmp / "files")
    site.stack = request.param
    site.server = server
    yield site
    site.stop()


# ---------------------------------------------------------------- the client

def picture(size=(640, 480), color=(200, 80, 40), kind="PNG"):
    """Bytes of a real image."""
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, kind)
    return out.getvalue()


PDF = (b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj 2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n"
       b"3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 200 200]>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n")


def unique(prefix="u"):
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def user_fields(username, **changes):
    fields = {"username": username, "password": "secret1", "password_confirm": "secret1", "firstname": "Ada",
              "lastname": "Lovelace", "email": f"{username}@example.org", "telephone": "+1 555 0100",
              "timezone": "Europe/London", "summary": "I like events.", "street1": "1 Main St", "street2": "",
              "city": "Springfield", "state": "IL", "zip": "62701", "country": "USA"}
    fields.update(changes)
    return fields


def event_fields(**changes):
    fields = {"title": "Picnic in the park", "summary": "Bring food.", "description": "A long afternoon outside.",
              "date": "2099-06-01", "time": "14:30", "telephone": "555 0199", "street1": "2 Park Ave",
              "street2": "", "city": "Springfield", "state": "IL", "zip": "62701", "country": "USA",
              "tags": "picnic outdoors"}
    fields.update(changes)
    return fields


class Browser:
    """A requests session (cookies kept) on one site, with Olio's common steps."""

    def __init__(self, url):
        self.url = url
        self.session = requests.Session()

    def get(self, path, **kwargs):
        return self.session.get(self.url + path, allow_redirects=False, timeout=30, **kwargs)

    def post(self, path, data=None, files=None, ajax=False, **kwargs):
        headers = {"X-Requested-With": "XMLHttpRequest"} if ajax else {}
        return self.session.post(self.url + path, data=data, files=files, headers=headers,
                                 allow_redirects=False, timeout=30, **kwargs)

    def register(self, username=None, image=True, **changes):
        """Register (and so log in) a new user; (user id, user name)."""
        username = username or unique()
        files = {"image": ("me.png", picture((300, 200)), "image/png")} if image else None
        r = self.post("/users", data=user_fields(username, **changes), files=files)
        assert r.status_code == 303, r.text[:2000]
        return int(re.fullmatch(r".*/users/(\d+)", r.headers["Location"]).group(1)), username

    def login(self, username, password="secret1"):
        r = self.post("/users/login", data={"username": username, "password": password})
        assert r.status_code == 303, r.text[:2000]
        return r

    def logout(self):
        return self.get("/users/logout")

    def add_event(self, image=True, document=True, **changes):
        """Add an event through the form; its id."""
        files = {}
        if image:
            files["image"] = ("party.jpg", picture((800, 600), kind="JPEG"), "image/jpeg")
        if document:
            files["document"] = ("info.pdf", PDF, "application/pdf")
        r = self.post("/events", data=event_fields(**changes), files=files or None)
        assert r.status_code == 303, r.text[:3000]
        return int(re.fullmatch(r".*/events/(\d+)", r.headers["Location"]).group(1))


def event_ids(html):
    """Ids of the events a list page links to, in order."""
    found = re.findall(r'<h3><a href="/events/(\d+)">', html)
    return [int(i) for i in found]


def uploads(files):
    """Every uploaded file in a file store (relative names)."""
    root = Path(files)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "uploads" in p.parts)


def new_secret():
    return secrets.token_hex(32)
