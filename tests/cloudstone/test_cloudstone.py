"""Cloudstone's generator end to end: `sprout load run` drives a real Olio (gunicorn over a
loaded SQLite database) with Olio's Markov mix from two agents on loopback; the run's JSON
holds merged statistics, every check with its verdict, utilization, and an HTML report.
Also: bad workload and profile files are refused with reasons, and a dead site's failures
are counted by kind, never dropped."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, SPROUT
from olio_fixtures import APP_PATH, Gunicorn

OLIO_WORKLOAD = ROOT / "bench" / "workloads" / "olio.toml"


@pytest.fixture(scope="module")
def loaded_site(tmp_path_factory):
    work = tmp_path_factory.mktemp("cloudstone")
    db = f"sqlite:///{work / 'olio.db'}"
    files = work / "files"
    subprocess.run([sys.executable, "-m", "olio.loader", "--users", "1000", "--seed", "7", "--db", db, "--files", str(files), "--quiet"],
                   env={**os.environ, "PYTHONPATH": APP_PATH}, check=True, cwd=ROOT)
    site = Gunicorn(db, files, secret="cloudstone-test", workers=3).start()
    yield site
    site.stop()


def load_run(out, *args, check=True):
    cmd = [str(SPROUT), "load", "run", "--out", str(out), *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=check, timeout=600)


def test_two_agents_drive_olio_and_the_run_is_judged(loaded_site, tmp_path):
    out = tmp_path / "run"
    # The deployment's processes, listed as a cgroup lists them: gunicorn's master and workers.
    deployment = tmp_path / "deployment"
    deployment.mkdir()
    children = subprocess.run(["pgrep", "-P", str(loaded_site.process.pid)], capture_output=True, text=True).stdout.split()
    (deployment / "cgroup.procs").write_text("\n".join([str(loaded_site.process.pid), *children]) + "\n")
    # 30 users over two agents, 32 s of steady state in two 16 s windows; cycle times are
    # Olio's (5 s mean), so every user makes about six operations.
    r = load_run(out, "--url", loaded_site.url, "--users", 30, "--registered-users", 1000, "--agents", 2,
                 "--agent-cpus", "1", "--ramp-up", 3, "--steady", 32, "--window", 16, "--ramp-down", 2,
                 "--interval", 4, "--stack", "gunicorn", "--sut-cgroup", deployment)
    run = json.loads((out / "run.json").read_text())
    ops = run["operations"]
    assert set(ops) == {"HomePage", "Login", "TagSearch", "EventDetail", "PersonDetail", "AddPerson", "AddEvent"}
    total = sum(o["count"] + o["errors"] for o in ops.values())
    # 30 users x 32 s / ~5 s per cycle = ~190 operations, from both agents.
    assert 110 <= total <= 300, total
    assert sum(o["errors"] for o in ops.values()) == 0, {k: o["errors_by_kind"] for k, o in ops.items()}
    for name in ("HomePage", "TagSearch", "EventDetail"):
        assert ops[name]["count"] > 0 and 0 < ops[name]["p90_ms"] <= ops[name]["p99_ms"] <= ops[name]["max_ms"]
    # The stationary shares are computed from the matrix, not written down.
    assert abs(sum(o["target_pct"] for o in ops.values()) - 100) < 1e-6
    assert ops["EventDetail"]["target_pct"] > ops["AddPerson"]["target_pct"]
    # Two SLA windows, each with every operation's summary; both agents' users are counted.
    assert len(run["windows"]) == 2
    assert max(u for _, u in run["active_users"]) == 30
    names = [c["name"] for c in run["checks"]]
    assert names[:2] == ["SLA-1 (90th percentile)", "SLA-2 (99th percentile)"]
    assert {"operation mix", "mean cycle time", "attends on EventDetail", "users / ops per second", "errors"} <= set(names)
    assert all(c["detail"] for c in run["checks"])
    assert abs(run["mean_cycle_ms"] - 5000) < 1500
    # What the site served, from both agents: pages and assets, warm browsers revalidating
    # (answered 304) — every operation sends at least one request, pages bring their assets.
    counters = run["counters"]
    assert counters["http_requests"] > total and 0 < counters["http_not_modified"] < counters["http_requests"], counters
    assert run["utilization"] and len(run["utilization"][0]["cpu_busy"]) >= 2
    # Memory and CPU time are charged to the deployment's processes, by kind.
    assert run["utilization"][-1]["sut_pss_bytes"] > 10 * 2**20
    by_process = run["resources"]["cpu_seconds_by_process"]
    assert list(by_process) == ["python -m gunicorn"] and by_process["python -m gunicorn"] > 0.1, by_process
    assert (out / "report.html").read_text().count("<img") >= 3
    assert "Where the deployment's CPU time went" in (out / "report.html").read_text()
    assert "SLA-1 (90th):" in r.stdout


def test_a_dead_site_counts_every_failure_by_kind(tmp_path):
    from conftest import free_port
    r = load_run(tmp_path / "run", "--url", f"http://127.0.0.1:{free_port()}", "--users", 10, "--registered-users", 1000,
                 "--ramp-up", 1, "--steady", 10, "--ramp-down", 0, "--interval", 2, check=False)
    assert r.returncode == 0, r.stderr
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    errors = {k: v for o in run["operations"].values() for k, v in o["errors_by_kind"].items()}
    # Every operation fails to connect (an AddEvent fails earlier: its Login could not log in).
    assert set(errors) <= {"connect", "not logged in"} and errors["connect"] >= 8
    assert not run["sla1_passed"] and not run["sla2_passed"]
    assert "SLA-1 (90th): FAIL" in r.stdout


@pytest.mark.parametrize("change, message", [
    (lambda t: t.replace("[0, 11, 52, 36, 0, 1, 0],", "[0, 11, 52, 36, 0, 1],"), "row 1 has 6 weights"),
    (lambda t: t.replace('driver = "olio"', 'driver = "nope"'), 'no driver named "nope"'),
    (lambda t: t.replace('name = "Login"', 'name = "Logon"'), 'no operation "Logon"'),
    (lambda t: t.replace("mean_ms = 5000", "mean_ms = -1"), "mean_ms must be a non-negative number"),
])
def test_bad_workloads_are_refused_with_reasons(tmp_path, change, message):
    bad = tmp_path / "bad.toml"
    bad.write_text(change(OLIO_WORKLOAD.read_text()))
    r = load_run(tmp_path / "run", "--url", "http://127.0.0.1:9", "--registered-users", 1000, "--workload", bad,
                 "--steady", 1, "--ramp-up", 0, "--ramp-down", 0, check=False)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr


def test_a_bad_profile_is_refused_naming_the_line(tmp_path):
    profile = tmp_path / "profile.txt"
    profile.write_text("0 10\n30 20\n20 5\n")
    r = load_run(tmp_path / "run", "--url", "http://127.0.0.1:9", "--registered-users", 1000, "--profile", profile,
                 "--steady", 1, check=False)
    assert r.returncode != 0 and "line 3: times must increase" in r.stderr, r.stderr


def search_json(path, stack, sla1, sla2, trace):
    price = {"name": "paper-2008", "description": "test price", "usd_per_instance_hour": 0.8, "upfront_usd": 0.0,
             "usd_per_vcpu_hour": None, "usd_per_gb_hour": None}
    usd = {sla: {m: 576.0 / users for m in ("1", "12", "36")} for sla, users in (("sla1", sla1), ("sla2", sla2))}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "stack": stack, "machine": "test", "run_seconds": 300.0, "cpus": "0", "up_args": [], "instances": 1.0,
        "sla1_users": sla1, "sla2_users": sla2, "usd_per_user_month": {"paper-2008": usd}, "default_price": "paper-2008",
        "prices": [price],
        "trace": [{"users": u, "registered_users": u * 100, "sla1": s1, "sla2": s2, "ops_per_s": u / 5, "reason": "",
                   "report": str(path.parent / f"run-{u:05}/report.html")} for u, s1, s2 in trace]}))
    return path


def test_compare_reports_ratios_and_marks_a_maximum_no_run_failed_above(tmp_path):
    """A search stopped at --max with SLA-1 still passing found a lower bound, not a maximum:
    compare marks it (≥) and qualifies the ratio (at least), and cloudstone.json says so."""
    a = search_json(tmp_path / "a/search.json", "fast", 800, 750, [(700, True, True), (750, True, True), (800, True, False)])
    b = search_json(tmp_path / "b/search.json", "slow", 400, 300, [(300, True, True), (400, True, False), (500, False, False)])
    out, summary = tmp_path / "cmp", tmp_path / "cloudstone.json"
    subprocess.run([str(SPROUT), "cloudstone", "compare", a, b, "--out", out, "--json", summary], cwd=ROOT, check=True,
                   capture_output=True, text=True)
    md = (out / "compare.md").read_text()
    assert "| fast | ≥ 800 | 750 |" in md and "| slow | 400 | 300 |" in md, md
    assert "users per dollar at SLA-1: **at least 2.00×**" in md, md
    assert "users per dollar at SLA-2: **2.50×**" in md, md
    stacks = json.loads(summary.read_text())["stacks"]
    assert stacks["fast"]["sla1_lower_bound"] and not stacks["fast"]["sla2_lower_bound"]
    assert stacks["slow"]["sla1_users"] == 400 and not stacks["slow"]["sla1_lower_bound"]
    assert (out / "compare.html").exists() and (out / "compare_trace.png").exists()
    r = subprocess.run([str(SPROUT), "cloudstone", "compare", a], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "two or more" in r.stderr, r.stderr
