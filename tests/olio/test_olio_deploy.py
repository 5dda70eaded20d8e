"""Olio's two deployments (apps/olio/olio_deploy), each started for real and confined to one CPU:
the site answers with Olio's pages from a loaded database, the front server answers 304s for
static files and the file store, every process of the stack runs on the CPU asked for, a
killed app process is replaced, `up` twice refuses and `down` leaves nothing behind."""

import hashlib
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from email.utils import formatdate
from pathlib import Path

import psycopg
import pytest
import requests

from conftest import ROOT, SPROUT, free_port, mounts_under

sys.path.insert(0, str(ROOT / "apps" / "olio"))

import olio_deploy  # noqa: E402
from olio_deploy import confine, procs, sprout_stack  # noqa: E402
from olio_deploy.deploy import Deployment  # noqa: E402
from olio_deploy.state import State  # noqa: E402
from olio_fleet_helpers import cgroup_of  # noqa: E402
from olio_fleet_helpers import command as _command  # noqa: E402

# Each stack on its own CPU, so a test that only ever saw the default could not pass.
CPUS = {"conventional": "1", "sprout": "0"}
PYTHONPATH = f"{ROOT / 'python'}:{ROOT / 'apps' / 'olio'}"
CLI = [sys.executable, "-m", "olio_deploy"]


def state_dir():
    """A fresh state directory other users can pass through (PostgreSQL, nginx need to)."""
    path = tempfile.mkdtemp(prefix="olio-deploy-test-", dir="/tmp")
    os.chmod(path, 0o755)
    return Path(path)


def cli(*args, binary=None):
    argv = [str(SPROUT), "olio", *args] if binary else [*CLI, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": PYTHONPATH})


class Stack:
    def __init__(self, name, state, site):
        self.name, self.state, self.site = name, state, site
        self.cpus = CPUS[name]
        self.seen = set()  # every pid of the deployment seen by a test, for the down check

    @property
    def dep(self):
        state = State(self.state)
        return Deployment(state, state.record())

    def pids_from_pidfiles(self):
        """The deployment's processes found without asking olio_deploy: the programs' own pid
        files, and everything below them."""
        s = self.state
        files = [s / "pg" / "data" / "postmaster.pid"]
        if self.name == "conventional":
            files += [s / "run" / "nginx.pid", s / "run" / "gunicorn.pid", s / "run" / "memcached.pid"]
        else:
            files += [s / "worker" / "worker.pid", s / "run" / "cache.pid"]
        found = set()
        for f in files:
            pid = procs.read_pid(f)
            assert pid and procs.alive(pid), f"{f} names no running process"
            found |= {pid, *procs.descendants(pid)}
        self.seen |= found
        return found

    def get(self, path="/", **kw):
        return requests.get(self.site.url + path, timeout=60, **kw)


@pytest.fixture(scope="module", params=["conventional", "sprout"])
def stack(request):
    name = request.param
    state = state_dir()
    try:
        with olio_deploy.running(name, state, cpus=CPUS[name], cache=True, users=100, allow_small=True, seed=7) as site:
            yield Stack(name, state, site)
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_the_site_answers_with_olio_pages_from_the_loaded_database(stack):
    home = stack.get("/")
    assert home.status_code == 200
    assert "<title>Upcoming events · Olio</title>" in home.text
    events = re.findall(r'href="/events/(\d+)"', home.text)
    assert events, "the loaded events are listed"
    detail = stack.get(f"/events/{events[0]}")
    assert detail.status_code == 200 and "Olio" in detail.text
    assert stack.get("/users/1").status_code == 200
    assert stack.get("/events/999999").status_code == 404
    if stack.name == "sprout":
        # Rendered from templates compiled to Python at build, and to bytecode at upload.
        [published] = (stack.state / "worker" / "registry").glob("olio@*[0-9]")
        assert (published / "olio" / "compiled_templates" / "jinja2.version").is_file()
        assert list((published / "olio" / "compiled_templates" / "__pycache__").glob("tmpl_*.pyc"))


def test_the_loaded_tables_are_vacuumed_and_analyzed_before_the_site_opens(stack):
    """So that autovacuum's insert-triggered VACUUM does not run inside a measurement."""
    with psycopg.connect(stack.site.db_url) as conn:
        tables = conn.execute("SELECT relname, last_vacuum, last_analyze FROM pg_stat_user_tables").fetchall()
    assert {"user", "event", "attendance"} <= {name for name, _, _ in tables}
    assert all(vacuumed and analyzed for _, vacuumed, analyzed in tables), tables


def _static_hits(stack):
    token = (stack.state / "worker" / "api-token").read_text().strip()
    metrics = requests.get(stack.dep.api_url + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10).text
    return {m.group(1, 2): float(m.group(3)) for m in
            re.finditer(r'sprout_static_requests_total\{prefix="([^"]+)",status="(\d+)"\} (\S+)', metrics)}


@pytest.mark.parametrize("kind", ["static", "files"])
def test_the_front_server_answers_304_to_if_modified_since(stack, kind):
    if kind == "static":
        path = ROOT / "apps" / "olio" / "olio" / "static" / "css" / "olio.css"
        url = "/static/css/olio.css"
    else:
        path = stack.site.files / "probe.txt"
        path.write_text("a file in the store\n")
        path.chmod(0o644)
        url = "/files/probe.txt"
    before = _static_hits(stack) if stack.name == "sprout" else None
    first = stack.get(url)
    assert first.status_code == 200 and first.content == path.read_bytes()
    modified = first.headers["Last-Modified"]
    assert modified == formatdate(int(path.stat().st_mtime), usegmt=True)
    again = stack.get(url, headers={"If-Modified-Since": modified})
    assert again.status_code == 304 and again.content == b""
    stale = stack.get(url, headers={"If-Modified-Since": formatdate(int(path.stat().st_mtime) - 3600, usegmt=True)})
    assert stale.status_code == 200
    if stack.name == "conventional":
        # nginx's own answers: its ETag (mtime-size in hex) and its expires header; the app's
        # static route would send neither.
        st = path.stat()
        assert first.headers["ETag"] == f'"{int(st.st_mtime):x}-{st.st_size:x}"'
        assert first.headers["Cache-Control"] in ("max-age=3600", "max-age=604800")
    else:
        # The worker's static mapping counts what it serves; the lambda never saw these.
        after = _static_hits(stack)
        prefix = f"/{kind}/"
        assert after.get((prefix, "200"), 0) - before.get((prefix, "200"), 0) == 2
        assert after.get((prefix, "304"), 0) - before.get((prefix, "304"), 0) == 1


def test_uploads_land_in_the_shared_file_store_and_the_front_server_serves_them(stack):
    from olio_fixtures import Browser, uploads

    browser = Browser(stack.site.url)
    browser.register()
    event = browser.add_event()
    page = browser.get(f"/events/{event}")
    assert page.status_code == 200
    linked = set(re.findall(r'(?:src|href)="(/files/[^"]*uploads[^"]*)"', page.text))
    assert len(linked) >= 2, "the event's picture (or its thumbnail) and its document"
    for path in linked:
        served = stack.get(path)
        assert served.status_code == 200 and served.content == (stack.site.files / path[len("/files/"):]).read_bytes()
    owners = {(stack.site.files / name).stat().st_uid for name in uploads(stack.site.files)}
    # Sandboxes write as the sandbox user, through the volume; gunicorn as its own user.
    assert (owners == {65534}) == (stack.name == "sprout"), owners


def test_every_process_of_the_stack_runs_on_the_cpus_asked_for(stack):
    for _ in range(5):
        assert stack.get("/").status_code == 200
    for _ in range(10):  # PostgreSQL starts and ends an autovacuum worker now and then: retry
        found = stack.pids_from_pidfiles()
        in_group = set(stack.dep.confinement.pids())
        if found == in_group:
            break
        time.sleep(0.3)
    assert found == in_group, "the cgroup holds exactly the stack's processes"
    commands = {pid: _command(pid) for pid in found}
    allowed = {pid: procs.cpus_allowed(pid) for pid in found}
    assert set(allowed.values()) - {None} == {stack.cpus}, allowed

    def count(pattern):
        return sum(1 for c in commands.values() if re.search(pattern, c))

    assert count(r"^postgres: olio olio 127\.0\.0\.1") >= 1, "the app's database connections"
    assert count(r"^postgres: (checkpointer|walwriter|logger)") >= 2
    if stack.name == "conventional":
        assert count(r"^nginx: worker process") == 1  # one per core
        assert count(r"^nginx: master process") == 1
        assert count(r"gunicorn") == 1 + 3  # the master and (2 x 1) + 1 workers
        assert count(r"^/usr/bin/memcached .*-t 1 ") == 1
    else:
        sandboxes = [p for p in found if "/sb-" in Path(f"/proc/{p}/cgroup").read_text()]
        assert sandboxes, "a sandbox serves the site"
        assert count(r"helper\.py zygote") >= 2  # the root Zygote and Flask's, at least
        assert count(r"sprout cache serve .*-t 1 --cpus " + stack.cpus) == 1
        assert count(r"sprout worker up") == 1


def _lasting(pids):
    """The processes that live as long as the deployment, by pid with their command lines: not
    the sandboxes and Zygotes (the worker's keep-alive and import cache end idle ones), not
    PostgreSQL's per-connection backends and autovacuum or parallel workers (they end with
    their client or their task)."""
    passing = re.compile(r"^postgres: (olio |autovacuum worker|parallel worker)|helper\.py ")
    lasting = {}
    for pid in pids:
        try:
            cgroup = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            continue  # already gone: it was one of the passing ones
        command = _command(pid)
        if "/sb-" not in cgroup and command and not passing.search(command):
            lasting[pid] = command
    return lasting


def test_up_twice_refuses_and_leaves_the_running_one_alone(stack):
    before = _lasting(stack.pids_from_pidfiles())
    assert len(before) >= 5, before  # the worker or front server, the cache, PostgreSQL's own
    out = cli("up", "--stack", stack.name, "--dir", str(stack.state), "--port", str(free_port()), binary=True)
    assert out.returncode == 1
    assert "already running" in out.stderr and "down --dir" in out.stderr
    assert stack.get("/").status_code == 200
    ended = {p: c for p, c in before.items() if not procs.alive(p)}
    assert not ended, f"the second up ended processes of the first: {ended}"
    status = cli("status", "--dir", str(stack.state), binary=True)
    assert status.returncode == 0, status.stdout + status.stderr
    assert '"state": "up"' in status.stdout and f'"cpus": "{stack.cpus}"' in status.stdout


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _exe(pid):
    """What process `pid` runs ("" once it has ended: sandboxes come and go while we look)."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except FileNotFoundError:
        return ""


def test_every_python_process_runs_the_sandbox_bases_interpreter_build(stack):
    """The Cloudstone comparison's footing: both stacks run one CPython build. Every Python
    process of the stack (found from the pid files, hashed here from /proc) runs the very
    executable of the sandbox base's python3 and maps no other libpython; `status` says so."""
    for _ in range(3):
        assert stack.get("/").status_code == 200
    base = Path(sprout_stack.SANDBOX_BASE)
    base_python = (base / "usr/bin/python3").resolve()  # -> python3.11, a relative link
    want = _sha256(base_python)
    python = {p for p in stack.pids_from_pidfiles() if Path(_exe(p)).name.startswith("python")}
    assert len(python) >= (4 if stack.name == "conventional" else 2), {p: _command(p) for p in python}
    for pid in python:
        try:
            exe_sha, maps = _sha256(f"/proc/{pid}/exe"), Path(f"/proc/{pid}/maps").read_text()
        except FileNotFoundError:
            continue  # a sandbox that ended since it was listed
        assert exe_sha == want, f"{_command(pid)} runs {_exe(pid)}, not {base_python}"
        assert "libpython" not in maps, "Debian's python3.11 links libpython statically"
    status = cli("status", "--dir", str(stack.state), binary=True)
    record = json.loads(status.stdout)["interpreter"]
    assert record["identity"] == want[:16] and record["processes_match"], record
    assert record["package"].startswith("python3.11-minimal "), record
    if stack.name == "conventional":
        # Debian's python3 in the deployment's virtual environment; the workers as www-data.
        assert record["venv"] and record["executable"] == "/usr/bin/python3.11", record
        master = procs.read_pid(stack.state / "run" / "gunicorn.pid")
        assert _command(master).startswith(f"{record['venv']}/bin/python -m gunicorn")
        owners = {pwd.getpwuid(os.stat(f"/proc/{p}").st_uid).pw_name for p in _gunicorn_workers(stack)}
        assert owners == {"www-data"}, owners
    else:
        assert record["root"] == str(base) and record["venv"] is None, record


def _sandbox_pids(stack):
    # cgroup_of reads "" for a sandbox that ended between the listing and the read.
    return {p for p in stack.pids_from_pidfiles() if "/sb-" in cgroup_of(p)}


def _gunicorn_workers(stack):
    return set(procs.children(procs.read_pid(stack.state / "run" / "gunicorn.pid")))


def test_a_killed_app_process_is_replaced_and_the_site_keeps_answering(stack):
    assert stack.get("/").status_code == 200
    current = _gunicorn_workers if stack.name == "conventional" else _sandbox_pids
    victims = current(stack)
    assert victims
    victim = min(victims)
    os.kill(victim, signal.SIGKILL)
    # Once it is dead (not while SIGKILL is still on its way: a request handed to it then is
    # lost on either stack), no request may fail.
    assert procs.wait_gone(victim, 10)
    for _ in range(20):
        assert stack.get("/").status_code == 200
    deadline = time.time() + 30
    while time.time() < deadline:
        now = current(stack)
        if victim not in now and len(now) >= len(victims) and now - victims:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"no replacement for {victim}: had {victims}, now {current(stack)}")
    stack.pids_from_pidfiles()
    assert stack.get("/").status_code == 200


def test_down_leaves_no_process_mount_or_cgroup(stack):
    stack.pids_from_pidfiles()
    dep = stack.dep
    group = dep.confinement.group
    worker_groups = [f"sprout-olio-{dep.confinement.name.rsplit('-', 1)[-1]}"]
    assert group.is_dir()
    olio_deploy.down(stack.state)
    alive = [p for p in stack.seen if procs.alive(p)]
    assert alive == [], {p: procs.cpus_allowed(p) for p in alive}
    assert mounts_under(stack.state) == []
    assert not group.exists()
    for root in Path("/sys/fs/cgroup").iterdir():
        for name in worker_groups:
            assert not (root / name).exists(), root / name
    assert cli("status", "--dir", str(stack.state)).returncode == 3
    again = cli("down", "--dir", str(stack.state))
    assert again.returncode == 0 and "nothing was running" in again.stdout
    with pytest.raises(requests.ConnectionError):
        requests.get(stack.site.url, timeout=5)


# ---------------------------------------------------------------- no stack needed


def test_confinement_holds_children_even_when_they_widen_their_affinity():
    group = confine.Confinement.create("olio-deploy-test-" + str(os.getpid()), [1])
    try:
        script = "import os, time\nos.sched_setaffinity(0, {0, 1})\nprint(os.fork() and 'parent' or 'child', flush=True)\ntime.sleep(60)\n"
        child = subprocess.Popen([sys.executable, "-c", script], preexec_fn=group.enter, stdout=subprocess.PIPE)
        assert child.stdout.readline()
        time.sleep(0.2)
        members = group.pids()
        assert len(members) == 2 and child.pid in members
        assert {procs.cpus_allowed(p) for p in members} == {"1"}
    finally:
        group.destroy(grace=2)
    child.wait(timeout=10)
    assert not group.exists()


def test_without_a_cpuset_controller_affinity_confines_with_a_warning(monkeypatch):
    monkeypatch.setattr(confine, "detect", lambda: ("affinity", None))
    warnings = []
    group = confine.Confinement.create("olio-deploy-test-affinity", [1], warn=warnings.append)
    assert "sched_setaffinity only" in warnings[0]
    child = subprocess.Popen(["sh", "-c", "sleep 30 & exec sleep 30"], preexec_fn=group.enter)
    try:
        time.sleep(0.2)
        pids = [child.pid, *procs.descendants(child.pid)]
        assert len(pids) == 2 and {procs.cpus_allowed(p) for p in pids} == {"1"}
        assert group.pids() is None and group.destroy() == []
    finally:
        for pid in procs.descendants(child.pid):
            os.kill(pid, signal.SIGKILL)
        child.kill()
        child.wait()


def test_bad_requests_are_refused_with_a_clear_message_and_start_nothing(tmp_path):
    state = state_dir()
    try:
        out = cli("up", "--stack", "sprout", "--dir", str(state), "--cpus", "7", binary=True)
        assert out.returncode == 1 and "--cpus 7: no CPU 7 here" in out.stderr
        out = cli("up", "--stack", "sprout", "--dir", str(state), "--cpus", "zero")
        assert out.returncode == 1 and "use a CPU list" in out.stderr
        with socket_taken() as port:
            out = cli("up", "--stack", "conventional", "--dir", str(state), "--port", str(port))
            assert out.returncode == 1 and f"127.0.0.1:{port} is in use" in out.stderr
        out = cli("up", "--stack", "heroku", "--dir", str(state))
        assert out.returncode == 2 and "invalid choice: 'heroku'" in out.stderr
        out = cli("up", "--stack", "sprout", "--network", "open", "--dir", str(state))
        assert out.returncode == 2 and "invalid choice: 'open'" in out.stderr
        with pytest.raises(olio_deploy.DeployError, match="--network 'open': choose isolated or shared"):
            olio_deploy.up(olio_deploy.Options(stack="sprout", state=str(state), port=free_port(), network="open"))
        assert not (state / "deploy.json").exists()
        # pytest's tmp_path sits below a 0700 directory: PostgreSQL could not reach its data.
        out = cli("up", "--stack", "conventional", "--dir", str(tmp_path / "state"), "--port", str(free_port()))
        assert out.returncode == 1 and "the postgres user" in out.stderr and "cannot enter" in out.stderr
        assert cli("status", "--dir", str(state), binary=True).returncode == 3
        assert cli("down", "--dir", str(state)).returncode == 0
    finally:
        shutil.rmtree(state, ignore_errors=True)


class socket_taken:
    def __enter__(self):
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        return self.sock.getsockname()[1]

    def __exit__(self, *exc):
        self.sock.close()
