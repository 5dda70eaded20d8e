"""Fleet deployments (apps/olio/olio_deploy/fleet.py): three Olio sites on one port, told apart
by Host, on each stack (Sprout's lean sandboxes, Sprout with runc containers, nginx + a
gunicorn per site, nginx + uWSGI's Emperor with a vassal per site started on demand), each
started for real through `sprout olio fleet-up`. Every host answers
from its own database (one site's database is changed and only that host shows it, even
through the shared cache), an unknown host is refused, every process is under the printed
cgroup, and fleet-down leaves nothing. Bad input is refused before anything starts.

The stacks use one state directory in turn, so the template database is loaded once. The
on-demand stack's own behaviour (vassals started and stopped) is test_fleet_ondemand.py's."""

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
import requests

from conftest import ROOT, free_port, mounts_under, zygote_nodes
from olio_fleet_helpers import cgroup_of, cgroup_pids, fleet_file, host, olio
from olio_fleet_helpers import command as _command

sys.path.insert(0, str(ROOT / "apps" / "olio"))

from olio_deploy import procs  # noqa: E402

SITES = ["alpha", "bravo", "charlie"]
CPUS = {"sprout": "0", "sprout-runc": "0", "conventional": "1", "conventional-ondemand": "0"}
LIMITED = ("conventional", "conventional-ondemand")  # nginx in front; the budget is a memory limit
MARKER = "Fleet marker: only bravo has this event title"
MEMORY_MB = 2048


@pytest.fixture(scope="module")
def workdir():
    """One state directory for the three stacks in turn (others must pass through it)."""
    path = Path(tempfile.mkdtemp(prefix="olio-fleet-test-", dir="/tmp"))
    path.chmod(0o755)
    fleet_file(path / "fleet.json", [(name, host(name)) for name in SITES])
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Fleet:
    def __init__(self, stack, state, printed):
        self.stack, self.state, self.printed = stack, state, printed
        self.url = printed["url"]
        self.record = json.loads((state / "fleet.json").read_text())
        self.seen = set()

    def get(self, site_host, path="/"):
        return requests.get(self.url + path, headers={"Host": site_host}, timeout=60, allow_redirects=False)

    def pids(self):
        found = cgroup_pids(self.printed["cgroup"])
        self.seen |= found
        return found

    def sql(self, site, statement):
        with psycopg.connect(host=str(self.state / "pg" / "run"), port=self.record["ports"]["postgres"], user="postgres",
                             dbname=f"olio_{site}", autocommit=True) as conn:
            conn.execute(statement)


@pytest.fixture(scope="module", params=["sprout", "sprout-runc", "conventional", "conventional-ondemand"])
def fleet(request, workdir):
    stack, state = request.param, workdir / "state"
    out = olio("fleet-up", "--stack", stack, "--dir", str(state), "--fleet", str(workdir / "fleet.json"),
               "--cpus", CPUS[stack], "--port", str(free_port()), "--memory-mb", str(MEMORY_MB))
    assert out.returncode == 0, out.stderr[-4000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 1, out.stdout
    deployed = Fleet(stack, state, json.loads(lines[0]))
    try:
        yield deployed
    finally:
        if (state / "fleet.json").exists():
            olio("fleet-down", "--dir", str(state))


def test_fleet_up_prints_the_deployment(fleet):
    printed = fleet.printed
    assert set(printed) == {"stack", "url", "sites", "memory_mb", "cgroup", "memory_cgroup", "setup_s", "hosts"}
    assert printed["stack"] == fleet.stack and printed["sites"] == 3 and printed["memory_mb"] == MEMORY_MB
    assert printed["hosts"] == [host(n) for n in SITES]
    assert printed["url"].startswith("http://127.0.0.1:") and printed["setup_s"] > 0
    assert Path(printed["cgroup"]).is_dir()
    # The conventional stacks' budget is a memory limit (its group is named for the OOM
    # kills a run counts); the Sprout stacks keep theirs in the worker (on cgroup v1).
    if fleet.stack in LIMITED:
        group = Path(printed["memory_cgroup"])
        limit = group / ("memory.limit_in_bytes" if (group / "memory.limit_in_bytes").exists() else "memory.max")
        assert limit.read_text().strip() == str(MEMORY_MB * 2**20)


def test_every_host_answers_from_its_own_database(fleet):
    fleet.sql("bravo", f"UPDATE event SET title = '{MARKER}' WHERE id = 1")  # idempotent: the stacks share it
    for name in SITES:
        home = fleet.get(host(name))
        assert home.status_code == 200 and "<title>Upcoming events · Olio</title>" in home.text, name
    # bravo's page first, so that a cache shared across sites would hand it to the others.
    assert MARKER in fleet.get(host("bravo"), "/events/1").text
    for name in ("alpha", "charlie"):
        page = fleet.get(host(name).upper() + ":80", "/events/1")
        assert page.status_code == 200 and MARKER not in page.text, name
    assert MARKER in fleet.get(host("bravo"), "/events/1").text


def test_an_unknown_host_is_refused(fleet):
    for unknown in ("nowhere.fleet.test", "127.0.0.1"):
        answer = fleet.get(unknown)
        assert answer.status_code == 404, unknown
        if fleet.stack not in LIMITED:
            assert answer.json()["error"] == "site_not_found"


def test_static_files_are_served_for_every_site(fleet):
    for name in SITES:
        css = fleet.get(host(name), "/static/css/olio.css")
        assert css.status_code == 200 and css.content == (ROOT / "apps/olio/olio/static/css/olio.css").read_bytes()


def test_the_cgroup_holds_every_process_of_the_fleet_on_its_cpus(fleet):
    for name in SITES:
        assert fleet.get(host(name)).status_code == 200
    pids = fleet.pids()
    commands = [_command(p) for p in pids]
    assert {procs.cpus_allowed(p) for p in pids} - {None} == {CPUS[fleet.stack]}

    def count(text):
        return sum(1 for c in commands if text in c)

    assert count("postgres: olio olio_") >= 3, "each site's database connection"
    pg = procs.read_pid(fleet.state / "pg" / "data" / "postmaster.pid")
    assert pg in pids and set(procs.descendants(pg)) <= pids
    if fleet.stack == "conventional":
        masters = [procs.read_pid(fleet.state / "run" / "sites" / s / "gunicorn.pid") for s in SITES]
        assert set(masters) <= pids and all(set(procs.children(m)) <= pids for m in masters)
        assert count("gunicorn") == 3 * 2, "a master and one sync worker per site (peak 1 user)"
    if fleet.stack == "conventional-ondemand":
        emperor = procs.read_pid(fleet.state / "run" / "emperor.pid")
        assert emperor in pids and set(procs.descendants(emperor)) <= pids
        assert count("--emperor-on-demand-directory") == 1
        for name in SITES:  # each site's vassal, started by the requests above: its master and one process
            assert count(f"olio-{name} uWSGI master") == 1 and count(f"olio-{name} uWSGI worker 1") == 1, (name, commands)
    if fleet.stack in LIMITED:
        assert count("nginx: worker process") == 1 and count("/usr/bin/memcached") == 1
        limit = Path(fleet.record["memory_cgroup"]) / "memory.limit_in_bytes"
        assert int(limit.read_text()) == MEMORY_MB << 20
        assert all(str(Path(fleet.record["memory_cgroup"]).relative_to("/sys/fs/cgroup/memory")) in cgroup
                   for cgroup in map(cgroup_of, pids) if cgroup)
    else:
        assert count("sprout worker up") == 1 and count("sprout cache serve") == 1
        handler = "helper.py handler" if fleet.stack == "sprout-runc" else "/sb-"
        serving = [p for p in pids if handler in _command(p) + cgroup_of(p)]
        assert len(serving) >= 3, "a sandbox per site, found under the cgroup"


def test_fleet_status_and_a_second_fleet_up(fleet):
    status = olio("fleet-status", "--dir", str(fleet.state))
    assert status.returncode == 0, status.stdout + status.stderr
    report = json.loads(status.stdout)
    assert report["state"] == "up" and report["sites"] == 3 and report["memory"]["pss_mb"] > 0
    # What the sites hold, told from what they share: every site has served pages by now.
    sites = report["memory"]["sites"]
    assert len(SITES) <= sites["site_processes"]["count"] <= 3 * len(SITES), sites
    assert sites["db_connections"]["count"] >= 1, sites
    for kind in ("site_processes", "db_connections"):
        assert 0 < sites[kind]["private_mb"] <= sites[kind]["pss_mb"] < 200, sites
    again = olio("fleet-up", "--stack", fleet.stack, "--dir", str(fleet.state), "--fleet", str(fleet.state.parent / "fleet.json"),
                 "--port", str(free_port()))
    assert again.returncode == 1 and "already running" in again.stderr
    assert fleet.get(host("alpha")).status_code == 200


def test_sprouts_sites_are_forked_from_one_code_zygote_each_with_its_own_settings(fleet):
    """The sites share Olio's code but for olio.toml (ol.yaml's preload): once the code Zygote
    is up, every new sandbox of every site is forked from it, and still answers from its own
    site's database."""
    if fleet.stack != "sprout":
        pytest.skip("lean sandboxes only")
    import sprout

    api = sprout.Client(f"http://127.0.0.1:{fleet.record['ports']['api']}",
                        token=(fleet.state / "worker" / "api-token").read_text().strip())

    def code_nodes(stats):
        return [n for n in zygote_nodes(stats) if n["code"]]

    deadline = time.time() + 30
    while not code_nodes(api.stats()) and time.time() < deadline:
        time.sleep(0.2)
    assert len(code_nodes(api.stats())) == 1
    hits = api.stats()["import_cache"]["code_zygote_hits"]
    # Every site's sandboxes go; the next request of each is a cold start.
    sandboxes = Path("/sys/fs/cgroup/pids") / f"sprout-fleet-{fleet.record['confinement'].rsplit('-', 1)[-1]}"
    for group in sandboxes.glob("sb-*"):
        for pid in (group / "cgroup.procs").read_text().split():
            os.kill(int(pid), signal.SIGKILL)
    fleet.sql("bravo", f"UPDATE event SET title = '{MARKER}' WHERE id = 1")
    assert MARKER in fleet.get(host("bravo"), "/events/1").text
    for name in ("alpha", "charlie"):
        page = fleet.get(host(name), "/events/1")
        assert page.status_code == 200 and MARKER not in page.text, name
    assert api.stats()["import_cache"]["code_zygote_hits"] >= hits + len(SITES)


def test_fleet_down_leaves_no_process_mount_or_cgroup(fleet):
    fleet.pids()
    cgroup = Path(fleet.printed["cgroup"])
    out = olio("fleet-down", "--dir", str(fleet.state))
    assert out.returncode == 0, out.stderr
    assert [p for p in fleet.seen if procs.alive(p)] == []
    assert not cgroup.exists()
    assert mounts_under(fleet.state) == []
    tag = fleet.record["confinement"].rsplit("-", 1)[-1]
    assert [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/sprout-fleet-{tag}*")] == []
    if fleet.record.get("memory_cgroup"):
        assert not Path(fleet.record["memory_cgroup"]).exists()
    assert olio("fleet-status", "--dir", str(fleet.state)).returncode == 3
    with pytest.raises(requests.ConnectionError):
        requests.get(fleet.url, timeout=5)


# ---------------------------------------------------------------- refused before anything starts


def refused(tmp_path, fleet_path, *extra):
    state = tmp_path / "state"
    out = olio("fleet-up", "--stack", "sprout", "--dir", str(state), "--fleet", str(fleet_path), "--port",
               str(extra[0] if extra else free_port()), timeout=120)
    assert out.returncode == 1 and out.stdout == ""
    assert not state.exists(), "nothing was started or written"
    return out.stderr


def test_a_missing_fleet_file_is_refused(tmp_path):
    assert "no such file" in refused(tmp_path, tmp_path / "missing.json")


def test_a_duplicate_host_is_refused(tmp_path):
    path = fleet_file(tmp_path / "f.json", [("one", "same.fleet.test"), ("two", "Same.Fleet.Test")])
    assert "sites[1].host 'same.fleet.test' is also the host of sites[0]" in refused(tmp_path, path)


@pytest.mark.parametrize("name", ["Site1", "site_1", "", "x" * 51])
def test_a_bad_site_name_is_refused(tmp_path, name):
    path = fleet_file(tmp_path / "f.json", [(name, "a.fleet.test")])
    assert "sites[0].name" in refused(tmp_path, path)


def test_a_bad_host_is_refused(tmp_path):
    path = fleet_file(tmp_path / "f.json", [("one", "not a host")])
    assert "is not a DNS name" in refused(tmp_path, path)


def test_a_port_in_use_is_refused(tmp_path):
    path = fleet_file(tmp_path / "f.json", [("one", "one.fleet.test")])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert "is in use" in refused(tmp_path, path, busy.getsockname()[1])
