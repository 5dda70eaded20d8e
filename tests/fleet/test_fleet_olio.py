"""Olio on a 2-worker fleet: the site behind HAProxy's app port, its database in the fleet's
PostgreSQL (the one primary, which also holds the shared registry), its cache on two Sprout
cache servers that `sprout.cache` hashes keys over, and one file store every worker's
sandboxes mount (docs/fleet.md, "The data tiers")."""

import json
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import requests

from conftest import ROOT, SPROUT, free_port
from fleet_helpers import leftovers, sprout, stop_fleet
from olio_fixtures import Browser

sys.path.insert(0, str(ROOT / "apps" / "olio"))

from olio_deploy import filestore, sprout_stack  # noqa: E402

PACKAGE_CACHE = "/var/cache/sprout/packages"  # olio_deploy's: Olio's packages, installed once per machine
FILES_IN_SANDBOX = "/srv/olio-files"


def download_wheels(into):
    """Olio's pinned requirements as wheels, fetched by this host: a member of a fleet on one
    machine has no route past the host (docs/fleet.md), so its workers install from these."""
    into.mkdir()
    requirements = ROOT / "apps" / "olio" / "requirements.txt"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-r", str(requirements), "-d", str(into)],
                   check=True, capture_output=True, text=True, timeout=600)
    into.chmod(0o755)  # pip reads it as the sandbox user
    return into


def worker_config(files, wheels):
    """What every worker adds to the fleet's settings: the site on the app port, the file store
    in every sandbox, Olio's limits, the machine's package cache (filled from `wheels`)."""
    static = ROOT / "apps" / "olio" / "olio" / "static"
    return f"""
[app]
lambda = "olio"
static = {{ "/static/" = "{static}", "/files/" = "{files}" }}

[sandbox]
volumes = [{{ host = "{files}", path = "{FILES_IN_SANDBOX}", writable = true }}]

[limits]
memory_mb = 256
timeout_ms = 30000
max_body_mb = 16

[packages]
cache_dir = "{PACKAGE_CACHE}"
wheel_dir = "{wheels}"
offline = true
"""


def build_lambda(out, db_password, pg_port, cache_ports):
    """The Olio lambda as olio_deploy builds it, its olio.toml naming the fleet's services."""
    shim = SimpleNamespace(app_dir=ROOT / "apps" / "olio", python_dir=ROOT / "python", log=lambda _: None)
    out.mkdir()
    sprout_stack.copy_code(shim, out)
    cache = ",".join(f"olio-cache-{i}:{port}" for i, port in enumerate(cache_ports, 1))
    settings = {"db": f"postgresql://olio:{db_password}@olio-db/olio", "cache": cache, "files": FILES_IN_SANDBOX,
                "secret": secrets.token_hex(32)}
    (out / "olio.toml").write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
    (out / "f.py").write_text("from olio.wsgi import app  # noqa: F401\n")
    return out


def psql(status, statement):
    """One statement as the fleet's PostgreSQL superuser, over its Unix socket."""
    pg = status["postgres"]
    port = pg["address"].rsplit(":", 1)[1]
    subprocess.run(["psql", "-h", pg["socket_dir"], "-p", port, "-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1",
                    "-c", statement], check=True, capture_output=True, text=True)


def cache_stats(address):
    """`stats` of a cache server, as {name: value}."""
    with socket.create_connection(address, timeout=5) as s:
        s.sendall(b"stats\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            chunk = s.recv(65536)
            assert chunk, "the cache server closed the connection"
            data += chunk
    return dict(line.split()[1:3] for line in data.decode().splitlines() if line.startswith("STAT "))


def wait_for_site(url, seconds):
    """Until GET / answers 200 (the first request waits for Olio's packages and a Zygote)."""
    deadline, last = time.monotonic() + seconds, None
    while time.monotonic() < deadline:
        try:
            r = requests.get(url + "/", timeout=seconds)
            if r.status_code == 200:
                return r
            last = f"{r.status_code} {r.text[:500]}"
        except requests.RequestException as e:
            last = repr(e)
        time.sleep(1)
    raise AssertionError(f"{url} did not serve Olio within {seconds} s: {last}")


def test_olio_runs_on_a_two_worker_fleet_with_one_database_two_caches_and_one_file_store():
    # Under /tmp, entered by the sandbox user (the file store is mounted from here).
    top = Path(tempfile.mkdtemp(prefix="olio-fleet-", dir="/tmp"))
    top.chmod(0o755)
    directory, files = top / "fleet", top / "files"
    filestore.prepare(files, [filestore.SANDBOX_UID])
    (top / "worker.toml").write_text(worker_config(files, download_wheels(top / "wheels")))
    api, app, pg_port, cache_ports = free_port(), free_port(), free_port(), [free_port(), free_port()]
    services = [f"olio-db={pg_port}@olio"] + [f"olio-cache-{i}={p}@olio" for i, p in enumerate(cache_ports, 1)]
    up = sprout("fleet", "up", directory, "--workers", 2, "--cpus", "0,1", "--memory-mb", 768, "--policy", "consistent",
                "--listen", f"127.0.0.1:{api}", "--app-listen", f"127.0.0.1:{app}", "--postgres-port", pg_port,
                "--worker-config", top / "worker.toml", *[x for s in services for x in ("--service", s)], check=False)
    assert up.returncode == 0, up.stderr
    state = json.loads((directory / "fleet.json").read_text())
    caches = []
    try:
        status = json.loads(sprout("fleet", "status", directory).stdout)
        services_addr = status["services_address"]
        assert {s["name"] for s in status["services"]} == {"olio-db", "olio-cache-1", "olio-cache-2"}
        # Olio's database in the fleet's primary, under a role of its own (the registry's
        # superuser password stays with the fleet).
        db_password = secrets.token_hex(16)
        psql(status, f"CREATE ROLE olio LOGIN PASSWORD '{db_password}'")
        psql(status, "CREATE DATABASE olio OWNER olio")
        for port in cache_ports:
            caches.append(subprocess.Popen([str(SPROUT), "cache", "serve", "-l", services_addr, "-p", str(port), "-t", "1", "-m", "64"],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        build_lambda(top / "olio", db_password, pg_port, cache_ports)
        deployed = sprout("fleet", "deploy", directory, top / "olio", "--name", "olio", timeout=600, check=False)
        assert deployed.returncode == 0, deployed.stderr

        # Each worker serves the site from its own address (the machine's package cache is
        # shared: the first request waits for pip if it is cold, later ones find it there).
        direct = {w["name"]: f"http://{w['address']}:8080" for w in status["workers"]}
        for url in direct.values():
            wait_for_site(url, 900)
        site = f"http://127.0.0.1:{app}"
        home = wait_for_site(site, 120)
        assert "Olio" in home.text and home.headers.get("x-sprout-worker", "").startswith(f"f{state['plan']['tag']}w")

        # Written through HAProxy, read from each worker: one database, one file store, one
        # cookie secret (the session made on one worker holds on the other).
        browser = Browser(site)
        user_id, username = browser.register()
        event_id = browser.add_event(title="Fleet picnic", tags="fleet picnic")
        stored = set(re.findall(r'(?:src|href)="(/files/[^"]+)"', browser.get(f"/events/{event_id}").text))
        assert len(stored) >= 2, f"the event page links its picture and document: {stored}"
        for name, url in direct.items():
            other = Browser(url)
            for cookie in browser.session.cookies:  # the session cookie, sent to this worker's address
                other.session.cookies.set(cookie.name, cookie.value)
            page = other.get(f"/events/{event_id}")
            assert page.status_code == 200 and "Fleet picnic" in page.text, f"{name}: {page.status_code}"
            assert username in other.get(f"/users/{user_id}").text, f"{name} does not know the user"
            for path in stored:
                upload = other.get(path)
                assert upload.status_code == 200, f"{name}: {path} {upload.status_code}"
                assert upload.content[:2] in (b"%P", b"\xff\xd8"), f"{name}: {path} is {upload.content[:16]!r}"
            # Logged in on this worker too: the form for a new event is served, not a redirect.
            assert other.get("/events/new").status_code == 200, f"{name} did not honour the session"

        # The cache tier: keys spread over both servers by sprout.cache's consistent hashing.
        for i in range(12):
            assert browser.get("/events/tag_search", params={"tag": f"tag{i}"}).status_code == 200
            assert browser.get("/").status_code == 200
        stats = [cache_stats((services_addr, port)) for port in cache_ports]
        assert all(int(s["curr_items"]) > 0 for s in stats), f"keys on each cache server: {[s['curr_items'] for s in stats]}"
    finally:
        for cache in caches:
            cache.terminate()
            cache.wait(timeout=10)
        stop_fleet(directory, json.loads((directory / "fleet.json").read_text()))
        assert leftovers(directory, state) == []
        shutil.rmtree(top, ignore_errors=True)
