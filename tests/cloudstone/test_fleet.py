"""Cloudstone for a fleet end to end: `sprout cloudstone fleet --sites 3` deploys three Olio
sites (each its own PostgreSQL database and host name) as each of the five deployments,
drives every site with its own load profile through one port, judges every site, and writes
the summary, its table and its plot. Also: a bad stack name is refused before anything starts."""

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import ROOT, SPROUT, free_port

STACKS = ["sprout", "sprout-runc", "sprout-gvisor", "conventional", "conventional-ondemand"]


@pytest.fixture
def work():
    """PostgreSQL's server and nginx's workers run as their own users: the deployments' state
    is under a directory they can traverse (pytest's tmp_path is root's only)."""
    path = Path(tempfile.mkdtemp(prefix="fleet-test-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def fleet(work, *args, timeout=1800):
    out, summary = work / "fleet", work / "fleet.json"
    cmd = [str(SPROUT), "cloudstone", "fleet", "--out", str(out), "--json", str(summary), "--state", str(work / "state"),
           "--port", str(free_port()),
           *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout), out, summary


def three_sites(path):
    """Three sites busy enough to judge in 30 s: one user throughout, two for a while, and one
    who comes back after a quiet spell (its return is a first request after idle)."""
    profiles = [[[0, 1]], [[0, 0], [4, 2], [22, 0]], [[0, 1], [8, 0], [20, 1], [28, 0]]]
    sites = [{"name": f"site{i:04}", "host": f"site{i:04}.fleet.test", "rate_per_day": 0, "trigger": "test",
              "sessions": len(p), "peak_users": max(u for _, u in p), "mean_users": 0.5, "profile": p}
             for i, p in enumerate(profiles)]
    path.write_text(json.dumps({"version": 1, "seed": 1, "span_s": 30.0, "registered_users": 100, "session_mean_s": 20.0,
                                "sites": sites}))
    return path


def test_three_sites_run_end_to_end_on_every_deployment(work):
    r, out, summary_path = fleet(work, "--sites", 3, "--stacks", ",".join(STACKS), "--fleet", three_sites(work / "f.json"),
                                 "--idle-gap", 10, "--memory-mb", 2048)
    assert r.returncode == 0, r.stderr[-4000:]
    summary = json.loads(summary_path.read_text())
    assert summary["memory_budget_mb"] == 2048 and summary["span_s"] == 30
    for stack in STACKS:
        result = summary["stacks"][stack]
        [step] = result["steps"]
        assert step["sites"] == 3 and step["run"], step
        run = json.loads((out / step["run"]).read_text())
        sites = run["sites"]
        assert sorted(s["host"] for s in sites) == [f"site{i:04}.fleet.test" for i in range(3)]
        for site in sites:
            # Every site was driven through its own host name, and answered.
            assert site["requests"] > 0, (stack, site)
            assert sum(site["errors"].values()) == 0, (stack, site["host"], site["errors"])
            assert site["ops"]["HomePage"]["count"] > 0, (stack, site)
        assert run["requests"] == sum(s["requests"] for s in sites) == step["requests"]
        # Each site's first request, and the third site's first after its quiet spell.
        assert run["first_after_idle"]["count"] >= 4, run["first_after_idle"]
        # Memory and CPU were sampled from the deployment's own processes.
        pss = [s["sut_pss_bytes"] for s in run["utilization"] if s.get("sut_pss_bytes")]
        assert len(pss) >= 20 and 0 < max(pss) < 2048 * 2**20, (stack, max(pss, default=None))
        assert abs(step["peak_mb"] - run["resources"]["peak_pss_bytes"] / 2**20) < 1e-6
        assert step["sla2"] is not None and step["cpu_seconds"] > 0
        if stack.startswith("sprout"):
            # The run's worker log is kept when its state goes, for reading afterwards.
            assert "worker ready" in (work / "state" / "logs" / stack / "0003" / "worker.log").read_text()
    # Three lightly loaded sites fit any deployment: the lean one and the conventional one hold them.
    for stack in ("sprout", "conventional"):
        step = summary["stacks"][stack]["steps"][0]
        assert step["passed"], (stack, step["reason"])
        assert summary["stacks"][stack]["sites_sla2"] == 3 and summary["stacks"][stack]["usd_per_site_month"] > 0
    table = summary_path.with_suffix(".md").read_text()
    assert "| sprout | 3 |" in table and "| conventional | 3 |" in table
    assert summary_path.with_suffix(".png").stat().st_size > 10_000


def test_an_unknown_deployment_is_refused_before_anything_starts(work):
    r, out, summary = fleet(work, "--sites", 3, "--stacks", "sprout,kubernetes", timeout=60)
    assert r.returncode != 0 and "kubernetes" in r.stderr and "sprout-runc" in r.stderr
    assert not (out / "sprout").exists(), "nothing may run before the arguments are checked"
