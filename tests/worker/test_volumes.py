"""Volumes against a real worker: host directories every sandbox sees, writable only when
asked, for every backend and for handlers forked from package Zygotes; files a lambda writes
served on the app port while links it plants lead nowhere; bad settings refused naming the
key; nothing left mounted, and nothing of the host's deleted, after down, kill -9 or cleanup."""

import errno
import http.client
import json
import os
import signal
from pathlib import Path

import pytest
from test_backends import docker_engine  # noqa: F401  (the fixture, for the docker case)

from conftest import LAMBDAS, Worker, deploy_with, free_port, mounts_under, offline, zygote_nodes

RW, RO = "/srv/sprout-test-rw", "/srv/sprout-test-ro"
HELLO = "from the host\n"
SANDBOX_UID = 65534


@pytest.fixture
def host_dirs(tmp_path):
    """A directory the sandbox user may write, and one holding a file for it to read."""
    rw, ro = tmp_path / "rw", tmp_path / "ro"
    rw.mkdir()
    os.chown(rw, SANDBOX_UID, SANDBOX_UID)
    ro.mkdir()
    (ro / "hello.txt").write_text(HELLO)
    (tmp_path / "secret.txt").write_text("the host's secret\n")
    return rw, ro


def volumes(rw, ro):
    return [{"host": str(rw), "path": RW, "writable": True}, {"host": str(ro), "path": RO}]


TRY = {"write": {f"{RW}/out.txt": "written by a lambda", f"{RO}/nope.txt": "x"}, "read": [f"{RO}/hello.txt"]}


def check_tried(out, rw, ro, refused=errno.EROFS):
    """The lambda wrote the writable volume (as the sandbox user), read the other and could
    not write it (gVisor checks the directory's owner before the mount's flag: EACCES)."""
    assert out["uid"] == SANDBOX_UID
    assert out[f"write {RW}/out.txt"] == {"ok": True}
    assert out[f"read {RO}/hello.txt"] == {"ok": HELLO}
    assert out[f"write {RO}/nope.txt"] == {"errno": refused}
    written = rw / "out.txt"
    assert written.read_text() == "written by a lambda"
    assert (written.stat().st_uid, written.stat().st_gid) == (SANDBOX_UID, SANDBOX_UID)
    assert not (ro / "nope.txt").exists()


@pytest.mark.parametrize("backend", ["sock", "sock-nozygote", "runc", "docker", "gvisor"])
def test_lambdas_share_host_directories(make_worker, request, host_dirs, backend):
    if backend == "docker":
        request.getfixturevalue("docker_engine")
    rw, ro = host_dirs
    w = make_worker(sandbox={"backend": backend, "volumes": volumes(rw, ro), "start_timeout_ms": 60000})
    assert w.client.stats()["backend"] == backend
    w.deploy_test_lambda("volumes")
    check_tried(w.client.run("volumes", TRY), rw, ro, errno.EACCES if backend == "gvisor" else errno.EROFS)
    (rw / "from-host.txt").write_text("the host wrote this later")
    seen = w.client.run("volumes", {"read": [f"{RW}/from-host.txt"], "list": [RW]})
    assert seen[f"read {RW}/from-host.txt"] == {"ok": "the host wrote this later"}
    assert seen[f"list {RW}"] == {"ok": ["from-host.txt", "out.txt"]}


def test_handlers_forked_from_package_zygotes_see_volumes_too(make_worker, wheel_dir, host_dirs):
    rw, ro = host_dirs
    w = make_worker(**offline(wheel_dir, sandbox={"volumes": volumes(rw, ro)}, instances={"keep_warm": False}))
    source = (LAMBDAS / "volumes" / "f.py").read_text()
    deploy_with(w, "volumes-gamma", "import gamma\n" + source, "gamma==1.0\n")
    check_tried(w.client.run("volumes-gamma", TRY), rw, ro)
    stats = w.client.stats()
    gamma = [n for n in zygote_nodes(stats) if n["adds"] == ["gamma==1.0"]]
    assert gamma and gamma[0]["uses"] >= 1, stats["import_cache"]["tree"]


def mount_options(path):
    """The per-mount options of the mount at `path` (from /proc/self/mountinfo)."""
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        if fields[4] == str(path):
            return set(fields[5].split(","))
    return None


def test_volumes_are_nosuid_nodev_and_read_only_unless_writable(make_worker, host_dirs):
    rw, ro = host_dirs
    w = make_worker(sandbox={"volumes": volumes(rw, ro)})
    base = w.dir / "run" / "base"
    writable, read_only = mount_options(f"{base}{RW}"), mount_options(f"{base}{RO}")
    assert {"rw", "nosuid", "nodev"} <= writable and "ro" not in writable
    assert {"ro", "nosuid", "nodev"} <= read_only


def test_files_a_lambda_writes_are_served_but_links_it_plants_lead_nowhere(make_worker, host_dirs, tmp_path):
    rw, ro = host_dirs
    port = free_port()
    w = make_worker(sandbox={"volumes": volumes(rw, ro)},
                    app={"listen": f"127.0.0.1:{port}", "lambda": "volumes", "static": {"/files/": str(rw)}})
    w.deploy_test_lambda("volumes")
    secret = tmp_path / "secret.txt"
    planted = w.client.run("volumes", {
        "write": {f"{RW}/upload.txt": "an upload"},
        "link": {f"{RW}/leak-absolute": str(secret), f"{RW}/leak-relative": "../secret.txt",
                 f"{RW}/leak-etc": "/etc/hostname", f"{RW}/leak-root": "/"},
    })
    assert all(v == {"ok": True} for k, v in planted.items() if k != "uid"), planted
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/files/upload.txt")
    r = c.getresponse()
    assert r.status == 200 and r.read() == b"an upload"
    for path in ("/files/leak-absolute", "/files/leak-relative", "/files/leak-etc", "/files/leak-root/etc/hostname"):
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        assert r.status == 404 and b"secret" not in body, (path, r.status, body)


def test_down_unmounts_volumes_and_keeps_their_files(tmp_path, sprout_bin, host_dirs):
    rw, ro = host_dirs
    w = Worker(tmp_path / "w", {"sandbox": {"volumes": volumes(rw, ro)}})
    w.sprout("worker", "init", w.dir)
    w.sprout("worker", "up", w.dir, "--detach")
    try:
        w.deploy_test_lambda("volumes")
        check_tried(w.client.run("volumes", TRY), rw, ro)
        assert f"{w.dir}/run/base{RW}" in mounts_under(w.dir)
    finally:
        assert "worker stopped" in w.sprout("worker", "down", w.dir).stdout
    assert w.leftovers() == []
    assert (rw / "out.txt").read_text() == "written by a lambda" and (ro / "hello.txt").read_text() == HELLO


def test_kill_9_then_cleanup_or_up_unmounts_without_deleting_host_files(tmp_path, sprout_bin, host_dirs):
    rw, ro = host_dirs
    w = Worker(tmp_path / "w", {"sandbox": {"volumes": volumes(rw, ro)}})
    w.start()
    w.deploy_test_lambda("volumes")
    check_tried(w.client.run("volumes", TRY), rw, ro)
    w.process.send_signal(signal.SIGKILL)
    w.process.wait()
    assert f"{w.dir}/run/base{RW}" in mounts_under(w.dir)
    report = json.loads(w.sprout("worker", "cleanup", w.dir).stdout)
    assert report["mounts_removed"] >= 2 and w.leftovers() == []
    assert sorted(os.listdir(rw)) == ["out.txt"] and sorted(os.listdir(ro)) == ["hello.txt"]
    w.start()  # and again, this time leaving the cleanup to `up`
    w.process.send_signal(signal.SIGKILL)
    w.process.wait()
    w.start()
    assert "cleaned up after a worker that did not shut down" in w.log()
    assert w.client.run("volumes", {"read": [f"{RW}/out.txt"]})[f"read {RW}/out.txt"] == {"ok": "written by a lambda"}
    w.stop()
    assert w.leftovers() == []
    assert sorted(os.listdir(rw)) == ["out.txt"] and sorted(os.listdir(ro)) == ["hello.txt"]


def bad_volume_cases(tmp_path):
    d, file = str(tmp_path), str(tmp_path / "a-file")
    Path(file).write_text("x")
    return [
        ([{"host": d + "/none", "path": "/srv/x"}], "sandbox.volumes[0].host"),
        ([{"host": file, "path": "/srv/x"}], "sandbox.volumes[0].host"),
        ([{"host": "relative", "path": "/srv/x"}], "sandbox.volumes[0].host"),
        ([{"host": d, "path": "srv/x"}], "sandbox.volumes[0].path"),
        ([{"host": d, "path": "/srv/../etc"}], "sandbox.volumes[0].path"),
        ([{"host": d, "path": "/"}], "sandbox.volumes[0].path"),
        ([{"host": d, "path": "/proc/x"}], "sandbox.volumes[0].path"),
        ([{"host": d, "path": "/opt"}], "sandbox.volumes[0].path"),
        ([{"host": d, "path": "/packages"}], "sandbox.volumes[0].path"),
        ([{"host": d, "path": "/tmp/x"}], "sandbox.volumes[0].path"),
        ([{"host": d, "path": "/srv/x"}, {"host": d, "path": "/srv/x"}], "sandbox.volumes[1].path"),
        ([{"host": d, "path": "/srv/x"}, {"host": d, "path": "/srv/x/y"}], "sandbox.volumes[1].path"),
        ([{"host": d, "path": "/srv/x", "mode": "rw"}], "mode"),
        ([{"path": "/srv/x"}], "host"),
        # checked against the base image when the worker starts
        ([{"host": d, "path": "/etc"}], "sandbox.volumes[0].path"),
        ([{"host": d, "path": "/lib/sprout-test"}], "sandbox.volumes[0].path"),
    ]


def test_bad_volumes_stop_the_worker_naming_the_key(tmp_path, sprout_bin):
    for i, (vols, key) in enumerate(bad_volume_cases(tmp_path)):
        w = Worker(tmp_path / f"w{i}", {"sandbox": {"volumes": vols}})
        out = w.sprout("worker", "up", w.dir, check=False, timeout=120)
        assert out.returncode == 1 and key in out.stderr, (vols, out.stderr)
        assert w.leftovers() == []
    assert not Path("/var/lib/sprout/base-bookworm/lib/sprout-test").exists()
