"""Packages for lambdas: requirements.txt checked at upload, resolved and installed once into
the install cache (offline, from a local wheel directory here), seen read-only by exactly
the lambdas that asked for them, surviving restarts; install failures are clear errors."""

import os
import subprocess
import time

import pytest

import sprout
from conftest import SPROUT, Worker, deploy_with, offline, probe


@pytest.fixture(scope="module")
def pw(tmp_path_factory, sprout_bin, wheel_dir):
    """A worker installing from the test wheels, shared by this module's tests."""
    w = Worker(tmp_path_factory.mktemp("packages"), offline(wheel_dir))
    w.start()
    yield w
    w.stop()
    assert w.leftovers() == []


def test_unpinned_requirements_are_refused_naming_the_lines(pw):
    with pytest.raises(sprout.SproutError) as err:
        deploy_with(pw, "loose", probe(), "alpha==1.0\nbeta>=1.0\ngamma\n")
    e = err.value
    assert (e.status, e.code) == (400, "unpinned_requirements")
    assert "line 2" in e.message and "beta>=1.0" in e.message and "line 3" in e.message and "gamma" in e.message
    assert "line 1" not in e.message
    assert "loose" not in pw.client.list()


@pytest.mark.parametrize("line", ["-r other.txt", "--index-url http://example.invalid/simple", "alpha @ https://x/a.whl", "==1.0"])
def test_malformed_requirements_are_refused(pw, line):
    with pytest.raises(sprout.SproutError) as err:
        deploy_with(pw, "bad-reqs", probe(), f"beta==1.0\n{line}\n")
    assert (err.value.status, err.value.code) == (400, "invalid_requirements")
    assert "line 2" in err.value.message


def test_a_lambda_sees_exactly_its_packages_and_their_dependencies(pw):
    deploy_with(pw, "uses-alpha", probe(["alpha"]), "alpha==1.0\nbeta==1.0\n")
    out = pw.client.run("uses-alpha", {"try": ["gamma"]})
    # Dependencies first, each package in its own read-only directory.
    assert out["paths"] == ["/packages/beta==1.0", "/packages/alpha==1.0"]
    assert out["beta2"] is False  # the pinned beta 1.0, not the newest
    # gamma is in the install cache (below) but not on this lambda's path.
    deploy_with(pw, "uses-gamma", probe(["gamma"]), "gamma==1.0\n")
    assert pw.client.run("uses-gamma", {"try": ["alpha", "beta"]}) == {
        "preloaded": ["gamma"], "paths": ["/packages/gamma==1.0"], "alpha": False, "beta": False,
    }
    assert pw.client.run("uses-alpha", {"try": ["gamma"]})["gamma"] is False
    installed = {p["key"] for p in pw.client.packages()}
    assert {"alpha==1.0", "beta==1.0", "gamma==1.0"} <= installed


def test_dependencies_resolve_to_the_newest_that_fits_when_not_named(pw):
    deploy_with(pw, "alpha-only", probe(["alpha"]), "alpha==1.0\n")
    out = pw.client.run("alpha-only")
    assert out["paths"] == ["/packages/beta==2.0", "/packages/alpha==1.0"] and out["beta2"] is True


def test_package_directories_are_read_only(pw):
    source = """
import os
def f(event):
    results = {}
    for path in ("/packages/gamma==1.0/gamma/__init__.py", "/packages/gamma==1.0/new.py", "/packages/new.py"):
        try:
            with open(path, "a") as out:
                out.write("x")
            results[path] = "written"
        except OSError as e:
            results[path] = e.strerror
    return results
"""
    deploy_with(pw, "writer", source, "gamma==1.0\n")
    results = pw.client.run("writer")
    assert all(r in ("Read-only file system", "Permission denied") for r in results.values()), results
    cache = pw.dir / "packages" / "installed" / "gamma==1.0"
    assert (cache / "gamma" / "__init__.py").read_text().endswith("NAME = 'gamma'\n\n")
    assert all(p.stat().st_uid == 0 for p in cache.rglob("*")), "package files must belong to root"


def test_a_failed_install_is_a_clear_error_that_leaves_nothing_behind(pw):
    deploy_with(pw, "missing", probe(), "nosuchpackage==1.0\n")
    for _ in range(2):  # the failure is remembered, and reported again
        with pytest.raises(sprout.SproutError) as err:
            pw.client.run("missing")
        e = err.value
        assert (e.status, e.code) == (500, "install_failed")
        assert "nosuchpackage" in e.message
        assert "No matching distribution" in e.body["pip_output"] or "nosuchpackage" in e.body["pip_output"]
    installed = os.listdir(pw.dir / "packages" / "installed")
    assert not any(name.startswith("nosuchpackage") for name in installed)
    assert os.listdir(pw.dir / "packages" / "staging") == []
    assert pw.client.run("uses-gamma")["paths"] == ["/packages/gamma==1.0"]  # others unaffected


def test_a_broken_wheel_is_never_published(tmp_path, make_worker, wheel_dir):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "rotten-1.0-py3-none-any.whl").write_bytes(b"this is not a zip file")
    w = make_worker(**offline(wheels))
    deploy_with(w, "rotten", probe(), "rotten==1.0\n")
    with pytest.raises(sprout.SproutError) as err:
        w.client.run("rotten")
    assert err.value.code == "install_failed"
    assert [p for p in os.listdir(w.dir / "packages" / "installed") if not p.startswith(".")] == []


def test_a_restart_finds_the_install_cache_warm(tmp_path, sprout_bin, wheel_dir):
    w = Worker(tmp_path / "w", offline(wheel_dir))
    w.start()
    try:
        deploy_with(w, "uses-alpha", probe(["alpha"]), "alpha==1.0\nbeta==1.0\n")
        assert w.client.run("uses-alpha")["paths"] == ["/packages/beta==1.0", "/packages/alpha==1.0"]
        first = w.client.stats()["install_cache"]
        assert first["installs"] == 2 and first["resolutions"] == 1
        w.stop()
        w.start()
        assert w.client.run("uses-alpha")["paths"] == ["/packages/beta==1.0", "/packages/alpha==1.0"]
        again = w.client.stats()["install_cache"]
        assert again["installs"] == 0 and again["resolutions"] == 0 and again["hits"] == 2
    finally:
        w.stop()
    assert w.leftovers() == []


def test_preinstall_fills_the_cache_before_any_request(tmp_path, sprout_bin, wheel_dir):
    w = Worker(tmp_path / "w", offline(wheel_dir))
    w.sprout("worker", "init", w.dir)
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("alpha==1.0\nbeta==1.0\n")
    out = subprocess.run([str(SPROUT), "packages", "preinstall", str(reqs), "--dir", str(w.dir)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "alpha==1.0" in out.stdout and "beta==1.0" in out.stdout
    assert w.leftovers() == []  # its installer sandboxes are gone
    w.start()
    try:
        deploy_with(w, "uses-alpha", probe(["alpha"]), "alpha==1.0\nbeta==1.0\n")
        assert w.client.run("uses-alpha")["paths"] == ["/packages/beta==1.0", "/packages/alpha==1.0"]
        stats = w.client.stats()["install_cache"]
        assert stats["installs"] == 0 and stats["resolutions"] == 0
    finally:
        w.stop()


def test_preinstall_reports_pips_error(tmp_path, sprout_bin, wheel_dir):
    w = Worker(tmp_path / "w", offline(wheel_dir))
    w.sprout("worker", "init", w.dir)
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("nosuchpackage==1.0\n")
    out = subprocess.run([str(SPROUT), "packages", "preinstall", str(reqs), "--dir", str(w.dir)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "nosuchpackage" in out.stderr and "pip said" in out.stderr


def test_without_the_install_cache_every_sandbox_installs_afresh(make_worker, wheel_dir):
    w = make_worker(**offline(wheel_dir, packages={"install_cache": False}, instances={"keep_warm": False}))
    deploy_with(w, "uses-alpha", probe(["alpha"]), "alpha==1.0\nbeta==1.0\n")
    for _ in range(2):
        out = w.client.run("uses-alpha")
        assert len(out["paths"]) == 1 and out["paths"][0].startswith("/packages/.ephemeral/")
    stats = w.client.stats()["install_cache"]
    assert stats["installs"] == 2 and stats["enabled"] is False
    ephemeral = w.dir / "packages" / "installed" / ".ephemeral"
    deadline = time.time() + 10
    while os.listdir(ephemeral) and time.time() < deadline:
        time.sleep(0.1)
    assert os.listdir(ephemeral) == [], "per-sandbox installs outlived their sandboxes"
    assert [p for p in os.listdir(w.dir / "packages" / "installed") if not p.startswith(".")] == []
