"""The conventional-ondemand fleet (apps/olio/olio_deploy/fleet_ondemand.py): nginx in front of
uWSGI's Emperor, one vassal per site started at the first connection to the site's socket and
stopped after an idle time, deployed for real by `sprout olio fleet-up` with a 3 s idle time.

A site holds no process until its first request, which starts its vassal and answers with the
site's own data; an idle vassal's processes exit and the next request starts it again; a
crashing site (its processes killed, or its configuration broken) leaves the others serving;
fleet-down leaves nothing; bad settings are refused before anything starts."""

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
import requests

from conftest import ROOT, free_port, mounts_under
from olio_fleet_helpers import cgroup_pids, command, fleet_file, host, olio

sys.path.insert(0, str(ROOT / "apps" / "olio"))

from olio_deploy import procs  # noqa: E402

SITES = ["alpha", "bravo", "charlie"]
STACK = "conventional-ondemand"
IDLE_S = 3


@pytest.fixture(scope="module")
def workdir():
    path = Path(tempfile.mkdtemp(prefix="olio-ondemand-test-", dir="/tmp"))
    path.chmod(0o755)  # PostgreSQL and nginx run as their own users
    fleet_file(path / "fleet.json", [(name, host(name)) for name in SITES])
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Fleet:
    def __init__(self, state, printed):
        self.state, self.printed = state, printed
        self.url = printed["url"]
        self.record = json.loads((state / "fleet.json").read_text())
        self.seen = set()

    def get(self, name, path="/", timeout=60):
        return requests.get(self.url + path, headers={"Host": host(name)}, timeout=timeout, allow_redirects=False)

    def pids(self):
        found = cgroup_pids(self.printed["cgroup"])
        self.seen |= found
        return found

    def vassal(self, name):
        """The pids of site `name`'s vassal (its master and processes), by their names."""
        return sorted(p for p in self.pids() if f"olio-{name} uWSGI" in command(p) or f"{name}.ini" in command(p))

    def master(self, name):
        masters = [p for p in self.vassal(name) if "uWSGI master" in command(p) or f"--ini {name}.ini" in command(p)]
        return masters[0] if len(masters) == 1 else None

    def wait_until_idle(self, names, seconds=IDLE_S + 20):
        """Wait for every process of these sites' vassals to exit; the seconds it took."""
        began = time.monotonic()
        while any(self.vassal(n) for n in names):
            assert time.monotonic() - began < seconds, {n: [command(p) for p in self.vassal(n)] for n in names}
            time.sleep(0.2)
        return time.monotonic() - began

    def sql(self, site, statement):
        with psycopg.connect(host=str(self.state / "pg" / "run"), port=self.record["ports"]["postgres"], user="postgres",
                             dbname=f"olio_{site}", autocommit=True) as conn:
            conn.execute(statement)


@pytest.fixture(scope="module")
def fleet(workdir):
    state = workdir / "state"
    out = olio("fleet-up", "--stack", STACK, "--dir", state, "--fleet", workdir / "fleet.json", "--cpus", "0",
               "--port", free_port(), "--memory-mb", 2048, "--vassal-idle", IDLE_S)
    assert out.returncode == 0, out.stderr[-4000:]
    deployed = Fleet(state, json.loads(out.stdout))
    try:
        for name in SITES:
            deployed.sql(name, f"UPDATE event SET title = 'Only {name} has this title' WHERE id = 1")
        yield deployed
    finally:
        if (state / "fleet.json").exists():
            olio("fleet-down", "--dir", state)


def test_the_settings_are_recorded_and_written(fleet):
    assert fleet.record["stack_options"] == {"vassal_idle_s": IDLE_S, "vassal_processes": "auto"}
    ini = (fleet.state / "conf" / "vassals" / "alpha.ini").read_text()
    assert f"\nidle = {IDLE_S}\n" in ini and "\ndie-on-idle = true\n" in ini and "\nprocesses = 1\n" in ini
    assert "\nsocket" not in ini, "the socket is the Emperor's, handed to the vassal as fd 0"


def test_a_sites_first_request_starts_its_vassal(fleet):
    # fleet-up asked every site for its home page; left alone, each vassal goes.
    fleet.wait_until_idle(SITES)
    sockets = fleet.state / "run" / "vassals"
    assert sorted(p.name for p in sockets.iterdir()) == [f"{n}.socket" for n in SITES], "the Emperor holds every socket"
    assert fleet.vassal("alpha") == []
    page = fleet.get("alpha", "/events/1")
    assert page.status_code == 200 and "Only alpha has this title" in page.text
    assert "bravo" not in page.text and "charlie" not in page.text
    assert fleet.master("alpha") is not None
    assert fleet.vassal("bravo") == [] and fleet.vassal("charlie") == [], "only the asked site started"
    # Started by the Emperor, the vassal is confined as every process of the fleet is.
    assert {procs.cpus_allowed(p) for p in fleet.vassal("alpha")} == {"0"}


def test_an_idle_vassal_exits_and_the_next_request_starts_it_again(fleet):
    assert fleet.get("bravo").status_code == 200
    first = fleet.master("bravo")
    assert first is not None
    # Requests more often than the idle time keep it: the same vassal serves them all.
    for _ in range(2 * IDLE_S):
        assert fleet.get("bravo", "/static/css/olio.css").status_code == 200  # nginx's, not the vassal's
        assert fleet.get("bravo", "/events/1").status_code == 200
        time.sleep(1)
    assert fleet.master("bravo") == first
    took = fleet.wait_until_idle(["bravo"])
    # Its command line goes with its memory, a moment before the process itself is gone.
    deadline = time.monotonic() + 5
    while procs.alive(first) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not procs.alive(first)
    assert took < IDLE_S + 8, took
    page = fleet.get("bravo", "/events/1")
    assert page.status_code == 200 and "Only bravo has this title" in page.text
    again = fleet.master("bravo")
    assert again is not None and again != first


def _kill(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _answers_again(fleet, name, seconds=30):
    deadline = time.monotonic() + seconds
    while True:
        try:
            if fleet.get(name, "/events/1", timeout=10).status_code == 200:
                return True
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def test_a_site_whose_processes_are_killed_does_not_affect_another(fleet):
    assert fleet.get("alpha").status_code == 200 and fleet.get("bravo").status_code == 200
    master = fleet.master("bravo")
    workers = procs.children(master)
    assert workers
    _kill(workers)  # the vassal's master replaces them
    assert fleet.get("alpha", "/events/1").status_code == 200
    assert _answers_again(fleet, "bravo")
    assert fleet.master("bravo") == master
    _kill([fleet.master("bravo")])  # the whole vassal: the Emperor waits on its socket again
    assert fleet.get("alpha", "/events/1").status_code == 200
    assert _answers_again(fleet, "bravo")
    # An orphaned worker of the killed master may still answer a request from the inherited socket
    # before it notices its master is gone; the requests after it start a new vassal.
    assert _new_master(fleet, "bravo", master) not in (None, master), [command(p) for p in fleet.vassal("bravo")]


def _new_master(fleet, name, old, seconds=30):
    deadline = time.monotonic() + seconds
    while True:
        now = fleet.master(name)
        if now not in (None, old) or time.monotonic() > deadline:
            return now
        _answers_again(fleet, name, seconds=5)
        time.sleep(0.2)


def test_a_site_with_a_broken_configuration_does_not_affect_another(fleet):
    config = fleet.state / "conf" / "sites" / "charlie.olio.toml"
    good = config.read_text()
    try:
        config.write_text(good + 'colour = "blue"\n')  # an unknown key: Olio refuses to start
        _kill(fleet.vassal("charlie"))
        fleet.wait_until_idle(["charlie"])
        for _ in range(3):
            assert fleet.get("charlie", "/events/1").status_code == 502
            page = fleet.get("alpha", "/events/1")
            assert page.status_code == 200 and "Only alpha has this title" in page.text
        assert "unknown key 'colour'" in (fleet.state / "logs" / "sites" / "charlie.log").read_text()
        assert procs.alive(procs.read_pid(fleet.state / "run" / "emperor.pid"))
    finally:
        config.write_text(good)
    assert _answers_again(fleet, "charlie", seconds=60), "the mended site starts again"


def test_fleet_status_names_the_running_vassals(fleet):
    fleet.wait_until_idle(SITES)
    out = olio("fleet-status", "--dir", fleet.state)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["state"] == "up" and report["missing"] == []
    # fleet-status asks the first site for its page: that one vassal runs.
    assert report["emperor"]["running"] and report["emperor"]["vassals_running"] == 1
    assert report["emperor"]["vassal_idle_s"] == IDLE_S


def test_fleet_down_leaves_no_process(fleet):
    assert fleet.get("alpha").status_code == 200
    fleet.pids()
    cgroup = Path(fleet.printed["cgroup"])
    out = olio("fleet-down", "--dir", fleet.state)
    assert out.returncode == 0, out.stderr
    assert "emperor" in out.stdout
    assert [p for p in fleet.seen if procs.alive(p)] == []
    assert not cgroup.exists()
    if fleet.record.get("memory_cgroup"):
        assert not Path(fleet.record["memory_cgroup"]).exists()
    assert mounts_under(fleet.state) == []
    assert list((fleet.state / "run" / "vassals").glob("*.socket")) == []
    assert olio("fleet-status", "--dir", fleet.state).returncode == 3


# ---------------------------------------------------------------- refused before anything starts


@pytest.mark.parametrize("flags, says", [
    (["--vassal-idle", "0"], "--vassal-idle '0'"),
    (["--vassal-idle", "soon"], "--vassal-idle 'soon'"),
    (["--vassal-idle", "90000"], "from 1 to 86400"),
    (["--vassal-processes", "0"], "--vassal-processes"),
    (["--vassal-processes", "many"], "auto (the fewest that meet each site's peak) or a whole number"),
])
def test_bad_settings_are_refused(tmp_path, flags, says):
    path = fleet_file(tmp_path / "f.json", [("one", "one.fleet.test")])
    state = tmp_path / "state"
    out = olio("fleet-up", "--stack", STACK, "--dir", state, "--fleet", path, "--port", free_port(), *flags, timeout=120)
    assert out.returncode == 1 and out.stdout == "" and says in out.stderr, out.stderr
    assert not state.exists(), "nothing was started or written"


def test_a_vassal_setting_for_another_stack_is_refused(tmp_path):
    path = fleet_file(tmp_path / "f.json", [("one", "one.fleet.test")])
    out = olio("fleet-up", "--stack", "conventional", "--dir", tmp_path / "state", "--fleet", path, "--port", free_port(),
               "--vassal-idle", "30", timeout=120)
    assert out.returncode == 1 and "--vassal-idle: settings of the conventional-ondemand stack, not of conventional" in out.stderr
    assert not (tmp_path / "state").exists()


def test_a_state_directory_too_deep_for_the_sockets_is_refused(tmp_path):
    path = fleet_file(tmp_path / "f.json", [("one", "one.fleet.test")])
    state = tmp_path / ("d" * 90) / "state"
    out = olio("fleet-up", "--stack", STACK, "--dir", state, "--fleet", path, "--port", free_port(), timeout=120)
    assert out.returncode == 1 and "longer than 100 bytes" in out.stderr, out.stderr
    assert not state.exists()
