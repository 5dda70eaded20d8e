"""The worker's life cycle: init, up --detach, status, down, and recovery from kill -9."""

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import EXAMPLES, Worker, cgroup_dirs, mounts_under, root_zygote_pid


def sandbox_pids(worker):
    pids = []
    for name in worker.cgroup_names:
        for d in cgroup_dirs(name):
            for root, _dirs, files in os.walk(d):
                if "cgroup.procs" in files:
                    pids += [int(p) for p in open(os.path.join(root, "cgroup.procs")).read().split()]
    return sorted(set(pids))


def alive(pid):
    """Running (zombies, which only wait for their exit status to be read, do not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def paused_or_exiting(pid):
    """A process that cannot run: in a frozen cgroup (a paused handler, which cannot even die
    until thawed), or exiting (its memory gone, waiting for such a handler)."""
    try:
        if open(f"/proc/{pid}/cmdline").read() == "":
            return True
        for line in open(f"/proc/{pid}/cgroup").read().splitlines():
            _, controllers, path = line.split(":", 2)
            if "freezer" in controllers.split(","):
                state = open(f"/sys/fs/cgroup/freezer{path}/freezer.state").read().strip()
                return state == "FROZEN"
    except OSError:
        return True
    return False


def crash_mid_request(w):
    """kill -9 the worker while a handler is busy; returns the sandbox pids left running."""
    import threading

    w.deploy_test_lambda("sleepy")
    busy = threading.Thread(target=lambda: _ignore(w.client.run, "sleepy", {"seconds": 60}), daemon=True)
    busy.start()
    deadline = time.time() + 10
    while w.client.stats()["sandboxes"]["busy"] < 1 and time.time() < deadline:
        time.sleep(0.05)
    pids = sandbox_pids(w)
    w.process.send_signal(signal.SIGKILL)
    w.process.wait()
    time.sleep(0.2)
    return [p for p in pids if alive(p)]


def _ignore(fn, *args):
    try:
        fn(*args)
    except Exception:
        pass


def test_init_writes_a_documented_config_and_a_second_init_is_fast(tmp_path, sprout_bin):
    d = tmp_path / "w"
    first = subprocess.run([str(sprout_bin), "worker", "init", str(d)], capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    config = (d / "config.toml").read_text()
    assert 'listen = "127.0.0.1:5000"' in config and "# " in config
    started = time.time()
    again = subprocess.run([str(sprout_bin), "worker", "init", str(d)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "reused" in again.stderr
    assert time.time() - started < 5


@pytest.mark.parametrize("config, named", [
    ("[limits]\nmemroy_mb = 5\n", "memroy_mb"),
    ('[limits]\ncpu_weight_per = "tenant"\n', "cpu_weight_per"),
])
def test_bad_config_is_a_clear_error(tmp_path, sprout_bin, config, named):
    d = tmp_path / "w"
    d.mkdir()
    (d / "config.toml").write_text(config)
    out = subprocess.run([str(sprout_bin), "worker", "up", str(d)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and named in out.stderr, out.stderr


def test_detach_status_down(tmp_path, sprout_bin):
    w = Worker(tmp_path / "w", {})
    w.sprout("worker", "init", w.dir)
    up = w.sprout("worker", "up", w.dir, "--detach")
    assert "background" in up.stdout
    status = json.loads(w.sprout("worker", "status", w.dir).stdout)
    assert status["running"] and status["ready"] and status["backend"] == "sock"
    again = w.sprout("worker", "up", w.dir, "--detach", check=False)
    assert again.returncode == 1 and "already running" in again.stderr
    w.client.deploy(str(EXAMPLES / "echo"))
    assert w.client.run("echo", "detached") == "detached"
    assert "worker stopped" in w.sprout("worker", "down", w.dir).stdout
    status = w.sprout("worker", "status", w.dir, check=False)
    assert status.returncode == 3 and json.loads(status.stdout)["running"] is False
    assert w.leftovers() == []
    assert "no worker is running" in w.sprout("worker", "down", w.dir).stdout


@pytest.mark.parametrize("backend", ["sock", "sock-nozygote"])
def test_kill_9_then_up_starts_clean(tmp_path, sprout_bin, backend):
    w = Worker(tmp_path / "w", {"sandbox": {"backend": backend}})
    w.start()
    w.client.deploy(str(EXAMPLES / "echo"))
    for i in range(3):
        assert w.client.run("echo", i) == i
    survivors = crash_mid_request(w)
    if backend == "sock":
        # The root Zygote sees its channel close and exits; as init of the PID namespace
        # every sandbox was forked into, its exit takes them all down with it, except paused
        # handlers (the handler cache), which wait frozen for the cleanup to thaw them.
        assert all(paused_or_exiting(p) for p in survivors), survivors
    else:
        # Handlers started directly by the worker keep running until cleaned up.
        assert survivors
    assert mounts_under(w.dir) and w.leftovers()
    w.start()
    time.sleep(0.2)
    assert not any(alive(p) for p in survivors)
    assert "cleaned up after a worker that did not shut down" in w.log()
    assert w.client.run("echo", "after crash") == "after crash"
    w.stop()
    assert w.leftovers() == []
    assert sandbox_pids(w) == []


def test_cleanup_command_after_kill_9(tmp_path, sprout_bin):
    w = Worker(tmp_path / "w", {"sandbox": {"backend": "sock-nozygote"}})
    w.start()
    pids = crash_mid_request(w)
    assert pids and w.leftovers()
    report = json.loads(w.sprout("worker", "cleanup", w.dir).stdout)
    assert report["processes_killed"] >= 1 and report["mounts_removed"] >= 1
    assert any(r.startswith("nftables table") for r in report["network_removed"]), report
    assert w.leftovers() == [] and not any(alive(p) for p in pids)
    # nothing left: a second cleanup finds nothing
    report = json.loads(w.sprout("worker", "cleanup", w.dir).stdout)
    assert report == {"processes_killed": 0, "mounts_removed": 0, "cgroups_removed": [], "network_removed": []}


def test_cleanup_refuses_while_the_worker_runs(make_worker):
    w = make_worker()
    out = w.sprout("worker", "cleanup", w.dir, check=False)
    assert out.returncode == 1 and "is running" in out.stderr
    assert w.client.status() == "ready\n"


def test_a_dead_zygote_is_replaced(make_worker):
    w = make_worker()
    w.client.deploy(str(EXAMPLES / "echo"))
    assert w.client.run("echo", 1) == 1
    # The root Zygote (its sandboxes live in their own groups; a spare it just forked may be
    # in its group for a moment, on its way to one).
    os.kill(int(root_zygote_pid(w)), signal.SIGKILL)
    time.sleep(0.2)
    w.client.delete("echo")
    w.client.deploy(str(EXAMPLES / "echo"))  # a new version needs a new sandbox, hence a fork
    assert w.client.run("echo", 2) == 2
    assert w.client.stats()["backend_counters"]["zygote_restarts"] == 1


def filesystem_at(path):
    """The file system type mounted at `path` (the last mount there), or None."""
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == str(path):
                found = fields[fields.index("-") + 1]
    return found


def test_sandbox_slots_are_made_in_memory_and_go_with_the_worker(tmp_path, sprout_bin):
    """Each sandbox's root is a slot directory; kept sandboxes hold theirs, so a cold start
    beside them makes a new one, and on the worker's disk that cost up to 0.7 ms."""
    w = Worker(tmp_path / "w", {"instances": {"keep_warm": True}})
    w.start()
    slots = w.dir / "run" / "sb"
    assert filesystem_at(slots) == "tmpfs"
    for name in ("kept-a", "kept-b", "kept-c"):
        w.client.deploy(str(EXAMPLES / "echo"), name=name)
        assert w.client.run(name, name) == name
    made = sorted(int(p.name) for p in slots.iterdir())
    assert len(made) >= 3, made  # three sandboxes kept idle, each in a slot of its own
    assert all(filesystem_at(slots / str(n) / "root") is not None for n in made[:3])
    w.stop()
    assert w.leftovers() == []
    assert not slots.exists()


def test_a_sigterm_during_start_up_stops_the_worker_cleanly_once_it_is_up(tmp_path, sprout_bin):
    w = Worker(tmp_path / "w", {})
    w.sprout("worker", "init", w.dir)
    with open(w.log_path, "ab") as log:
        process = subprocess.Popen([str(sprout_bin), "worker", "up", str(w.dir)], stdout=log, stderr=log)
    deadline = time.time() + 10
    while not (w.dir / "worker.pid").exists() and time.time() < deadline:
        time.sleep(0.002)
    process.send_signal(signal.SIGTERM)  # its mounts, cgroups and Zygote are being made
    assert process.wait(timeout=60) == 0, w.log()
    assert "worker stopped" in w.log()
    assert w.leftovers() == []
