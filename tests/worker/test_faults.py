"""Handlers that misbehave: each gets a clear error, is contained by its sandbox, and the
worker keeps serving other requests throughout."""

import concurrent.futures
import os
import re
import subprocess
import time

import pytest

import sprout
from conftest import LAMBDAS


@pytest.fixture(scope="module")
def strict(tmp_path_factory, sprout_bin):
    """A worker with tight limits, shared by this module's tests."""
    from conftest import Worker

    w = Worker(tmp_path_factory.mktemp("strict"), {
        "limits": {"timeout_ms": 2000, "memory_mb": 64, "pids": 32},
    })
    w.start()
    for name in ("sleepy", "hog", "forkbomb", "probe", "spawner", "threader"):
        w.deploy_test_lambda(name)
    w.client.deploy(str(LAMBDAS.parent.parent / "examples" / "lambdas" / "echo"))
    yield w
    w.stop()
    assert w.leftovers() == []


def sandbox_processes(worker):
    """Host pids in this worker's sandbox cgroups (the Zygote's group excluded)."""
    pids = []
    for controller in ("memory", "pids"):
        root = f"/sys/fs/cgroup/{controller}/{worker.cgroup_names[0]}"
        if not os.path.isdir(root):
            continue
        for group in os.listdir(root):
            path = os.path.join(root, group, "cgroup.procs")
            if group.startswith("sb-") and os.path.exists(path):
                pids += [int(p) for p in open(path).read().split()]
        break
    return pids


def host_processes_matching(text):
    out = subprocess.run(["pgrep", "-af", text], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def test_timeout_kills_the_handler_with_504(strict):
    started = time.time()
    with pytest.raises(sprout.SproutError) as err:
        strict.client.run("sleepy", {"seconds": 30})
    assert (err.value.status, err.value.code) == (504, "timeout")
    assert time.time() - started < 10
    assert strict.client.run("sleepy", {"seconds": 0})["slept"] == 0


def test_memory_limit_kills_the_handler_and_says_memory(strict):
    with pytest.raises(sprout.SproutError) as err:
        strict.client.run("hog", {"mb": 512})
    assert (err.value.status, err.value.code) == (502, "out_of_memory")
    assert "memory" in err.value.message and "64 MiB" in err.value.message
    assert strict.client.run("hog", {"mb": 8}) == {"allocated_mb": 8}


def test_fork_bomb_is_held_by_the_pids_limit(strict):
    result = strict.client.run("forkbomb")
    assert result["children"] < 32, result
    assert "Resource temporarily unavailable" in result["error"]
    time.sleep(0.3)
    assert len(sandbox_processes(strict)) <= 1 + len(strict.client.stats()["lambdas"]["per_lambda"])
    assert strict.client.run("echo", "still serving") == "still serving"


def test_children_left_behind_are_killed_after_the_request(strict):
    result = strict.client.run("spawner")
    assert result["marker"] == "sleep 3600"
    time.sleep(0.3)
    assert host_processes_matching("sleep 3600") == []
    # the sandbox itself stays usable
    assert strict.client.run("spawner")["marker"] == "sleep 3600"


def test_a_handlers_own_threads_left_running_keep_its_sandbox_warm(strict):
    # The worker's check after a request counts the group's tasks first; threads of the one
    # process left make it ask cgroup.procs, which finds the helper alone: no cold start.
    assert strict.client.run("threader") == {"calls": 1, "threads": 2}
    assert strict.client.run("threader") == {"calls": 2, "threads": 3}


def test_writes_to_code_base_and_runtime_are_refused(strict):
    probe = strict.client.run("probe")
    for key in ("write_code", "write_new_code", "write_base", "write_etc", "write_runtime"):
        assert probe[key]["ok"] is False, (key, probe[key])
        assert probe[key]["errno"] in (13, 30), (key, probe[key])  # EACCES or EROFS
    assert probe["write_tmp"]["ok"] is True  # the scratch is writable
    original = (LAMBDAS / "probe" / "f.py").read_text()
    deployed = list((strict.dir / "registry").glob("probe@*/f.py"))
    assert deployed and all(p.read_text() == original for p in deployed)
    assert not list((strict.dir / "registry").glob("probe@*/new.py"))


def test_handler_runs_unprivileged_in_its_own_namespaces(strict):
    probe = strict.client.run("probe")
    assert probe["uid"] == 65534 and probe["gid"] == 65534
    assert probe["pid"] == 1 and probe["hostname"] == "sandbox" and probe["cwd"] == "/"
    assert probe["escape_chroot"]["ok"] is False and probe["escape_chroot"]["errno"] == 1  # EPERM


def test_host_files_outside_the_root_are_out_of_reach(strict, tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("top secret")
    paths = [str(secret), str(strict.dir / "config.toml"), "/etc/shadow"]
    reads = strict.client.run("probe", {"read": paths})["reads"]
    assert reads[str(secret)]["ok"] is False
    assert reads[str(strict.dir / "config.toml")]["ok"] is False
    # /etc/shadow inside is the base image's, unreadable to the sandbox user; never the host's
    assert reads["/etc/shadow"]["ok"] is False


def test_sandboxes_cannot_see_each_others_processes(strict):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        sleeper = pool.submit(strict.client.run, "sleepy", {"seconds": 1.5})
        time.sleep(0.5)
        others = sandbox_processes(strict)
        probe = strict.client.run("probe", {"signal": others})
        sleeper.result()
    assert probe["proc_pids"]["ok"] and probe["proc_pids"]["result"] == [1]
    for pid, outcome in probe["signals"].items():
        if int(pid) != 1:
            assert outcome["ok"] is False and outcome["errno"] == 3, (pid, outcome)  # ESRCH


def test_environment_is_clean(strict):
    env = strict.client.run("probe")["env"]
    assert env["HOME"] == "/host" and env["TMPDIR"] == "/tmp"
    assert not any(k.startswith("SPROUT") or k == "RUST_LOG" for k in env)


def test_worker_serves_others_while_a_handler_misbehaves(strict):
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        slow = pool.submit(lambda: pytest.raises(sprout.SproutError, strict.client.run, "sleepy", {"seconds": 30}))
        hog = pool.submit(lambda: pytest.raises(sprout.SproutError, strict.client.run, "hog", {"mb": 512}))
        for i in range(10):
            assert strict.client.run("echo", i) == i
        assert slow.result().value.code == "timeout"
        assert hog.result().value.code == "out_of_memory"



def test_a_sandbox_that_cannot_start_in_time_is_503_saying_which_process_and_how_long(tmp_path):
    """A platform failure is the platform's, not the lambda's: 503 `sandbox_start_failed`,
    naming the process that was late and the limit; its room is given back (the second call
    fails the same way, it is not left queued) and the worker keeps serving."""
    from conftest import Worker

    w = Worker(tmp_path / "w", {"sandbox": {"backend": "sock-nozygote", "start_timeout_ms": 1}})
    w.start()
    try:
        w.client.deploy(str(LAMBDAS.parent.parent / "examples" / "lambdas" / "echo"))
        for _ in range(2):
            with pytest.raises(sprout.SproutError) as failed:
                w.client.run("echo", {"x": 1})
            assert failed.value.status == 503 and failed.value.code == "sandbox_start_failed"
            assert re.search(r"the sandbox's helper did not (start|connect) within 1ms", str(failed.value)), failed.value
        assert w.client.status() == "ready\n"
    finally:
        w.stop()
    assert w.leftovers() == []


def test_a_worker_whose_python_cannot_run_says_what_it_ran(tmp_path):
    """With Zygotes the worker refuses to start; without, it refuses uploads (it cannot check
    their syntax) and keeps nothing."""
    from conftest import Worker

    with pytest.raises(RuntimeError, match="starting the root Zygote: running /usr/bin/no-such-python: "
                                           "the sandbox process could not exec: No such file or directory"):
        Worker(tmp_path / "zygote", {"sandbox": {"python": "/usr/bin/no-such-python"}}).start()
    w = Worker(tmp_path / "w", {"sandbox": {"backend": "sock-nozygote", "python": "/usr/bin/no-such-python"}})
    w.start()
    try:
        with pytest.raises(sprout.SproutError) as failed:
            w.client.deploy(str(LAMBDAS.parent.parent / "examples" / "lambdas" / "echo"))
        assert failed.value.status == 500 and failed.value.code == "internal"
        assert "running /usr/bin/no-such-python in the sandbox base: No such file or directory" in str(failed.value)
        assert w.client.list() == []
    finally:
        w.stop()
