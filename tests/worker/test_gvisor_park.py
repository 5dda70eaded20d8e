"""Parked gVisor pods (crates/sandbox/src/gvisor/slot.rs): a pod whose sandboxes have all
been paused for `park_after_ms` is checkpointed to disk and its processes end; the next
request restores it with its handlers as they were. Parked images count against a disk
budget, go with their lambda and with the worker, and a worker killed while parking or
restoring leaves nothing behind `sprout worker cleanup`."""

import json
import os
import re
import subprocess
import threading
import time

import pytest
from test_gvisor import gvisor_processes, pods, wait_for

from conftest import SPROUT, targz

COUNTER = ("import os, sys\n"
           "n = 0\n"
           "def f(e):\n"
           "    global n\n"
           "    n += 1\n"
           "    print('call', n, file=sys.stderr)\n"
           "    return {'n': n, 'pid': os.getpid(), 'tag': open('/handler/tag.txt').read()}\n")


def parking(worker):
    return worker.client.stats()["backends"]["gvisor"]["counters"].get("parking") or {}


def parked_images(worker):
    return sorted(p.name for p in (worker.dir / "run" / "gvisor").glob("parked-*"))


@pytest.fixture
def parker(make_worker):
    return make_worker(sandbox={"backend": "gvisor", "start_timeout_ms": 60000},
                       gvisor={"park_after_ms": 300, "pod_idle_ms": 500},
                       handler_cache={"pause_after_ms": 50}, limits={"timeout_ms": 5000})


def park_and_wait(worker, parks):
    assert wait_for(lambda: parking(worker).get("parks", 0) >= parks, 30), (parking(worker), worker.log()[-3000:])


def test_a_parked_pod_keeps_its_handlers_state_and_costs_no_memory(parker):
    parker.deploy_source("counter", COUNTER, **{"tag.txt": "a"})
    first = parker.client.run("counter")
    assert parker.client.run("counter")["n"] == 2
    park_and_wait(parker, 1)
    # (The template's pod may still be being made: its container is named -t.)
    assert [p for p in pods(parker) if not p.startswith("sprout-pod-t")] == [], "a parked pod's container is gone"
    assert len(parked_images(parker)) == 1
    assert parking(parker)["parked"] == 1 and parking(parker)["parked_bytes"] > 0
    reply = parker.client.request("POST", "counter", "", b"{}")
    body = reply.json()
    assert body["n"] == 3 and body["pid"] == first["pid"] and body["tag"] == "a", body
    assert reply.headers["x-sprout-start"] == "warm"
    assert parking(parker)["restores"] == 1 and parked_images(parker) == []
    # The parked handler's first request is timed in the worker, its pod's restore included.
    stats = parking(parker)
    assert stats["first_requests_after_park"] == 1, stats
    assert stats["first_request_after_park_p99_ms"] >= stats["restore_ms_mean"] > 0, stats
    # The restore's CPU is read from the pod's cgroup: some, and not more than it could use.
    assert 0 < parking(parker)["restore_cpu_ms_mean"] < 60_000, parking(parker)
    logs = parker.client.request_logs(reply.headers["x-sprout-request-id"])
    assert [e["message"] for e in logs if e["type"] in ("out", "err")] == ["call 3"], logs
    metrics = parker.client.metrics()
    assert "sprout_gvisor_parks_total 1" in metrics and "sprout_gvisor_restores_total 1" in metrics, metrics[-3000:]
    # Parked and restored again, and again.
    for n in (4, 5):
        park_and_wait(parker, n - 2)
        assert parker.client.run("counter")["n"] == n




LOADED_AT = ("import os, time\n"
             "LOADED = time.time()\n"
             "def f(e):\n"
             "    return {'loaded': LOADED, 'pid': os.getpid()}\n")


def test_a_lambda_started_on_deploy_is_parked_before_its_first_request_which_restores_it(make_worker):
    w = make_worker(sandbox={"backend": "gvisor", "start_timeout_ms": 60000},
                    instances={"start_on_deploy": True},
                    gvisor={"park_after_ms": 300, "pod_idle_ms": 500},
                    handler_cache={"pause_after_ms": 50}, limits={"timeout_ms": 5000})
    w.deploy_source("loaded", LOADED_AT)
    park_and_wait(w, 1)
    started = w.client.stats()["lambdas"]["started_on_deploy"]
    assert (started["made"], started["failed"], started["pending"]) == (1, 0, 0), started
    assert [p for p in pods(w) if not p.startswith("sprout-pod-t")] == [], "parked before any request"
    asked = time.time()
    reply = w.client.request("POST", "loaded", "", b"{}")
    assert reply.status == 200 and reply.headers["x-sprout-start"] == "warm", (reply.status, dict(reply.headers))
    assert reply.json()["loaded"] < asked, "the handler was loaded on deploy, not by the request"
    stats = parking(w)
    assert stats["restores"] == 1 and stats["first_requests_after_park"] == 1, stats
    assert w.client.stats()["cold_starts"] == 0

def test_park_hooks_run_before_the_park(parker):
    """sprout.on_park: the lambda lets go of what the image cannot keep; its hook ran once in
    the handler that was parked, and a hook that raises is reported and parks all the same."""
    parker.deploy_source("hooked", (
        "import sprout\n"
        "ran = []\n"
        "@sprout.on_park\n"
        "def bye():\n"
        "    ran.append('bye')\n"
        "@sprout.on_park\n"
        "def broken():\n"
        "    raise RuntimeError('a hook failed')\n"
        "def f(e):\n"
        "    return ran\n"))
    assert parker.client.run("hooked") == []
    park_and_wait(parker, 1)
    assert parker.client.run("hooked") == ["bye"]
    assert parking(parker)["park_failures"] == 0


def test_a_parked_image_goes_with_its_lambda_and_with_the_worker(parker):
    for name in ("gone", "kept"):
        parker.deploy_source(name, COUNTER, **{"tag.txt": name})
        assert parker.client.run(name)["n"] == 1
    park_and_wait(parker, 2)
    assert len(parked_images(parker)) == 2
    parker.client.delete("gone")
    assert wait_for(lambda: len(parked_images(parker)) == 1, 10), parked_images(parker)
    assert parking(parker)["parked"] == 1
    assert parker.client.run("kept")["n"] == 2
    park_and_wait(parker, 3)
    assert len(parked_images(parker)) == 1
    parker.stop()
    assert parked_images(parker) == [] and not (parker.dir / "run" / "gvisor").exists()


def test_the_disk_budget_evicts_the_oldest_image(make_worker):
    """Images of this lambda are about 13 MiB: a 20 MiB budget holds one. The older parked
    pod's image goes when the newer is parked; its lambda's next request is a cold start
    (its handler's state gone with the image), the other's is its own pod restored."""
    w = make_worker(sandbox={"backend": "gvisor", "start_timeout_ms": 60000},
                    gvisor={"park_after_ms": 300, "park_disk_mb": 20},
                    handler_cache={"pause_after_ms": 50}, limits={"timeout_ms": 5000})
    for name in ("old", "new"):
        w.deploy_source(name, COUNTER, **{"tag.txt": name})
        assert w.client.run(name)["n"] == 1
        park_and_wait(w, 1 if name == "old" else 2)
    assert wait_for(lambda: parking(w).get("evicted") == 1, 10), parking(w)
    assert parking(w)["parked"] == 1 and len(parked_images(w)) == 1
    assert parking(w)["parked_bytes"] <= 20 << 20
    restored = w.client.request("POST", "new", "", b"{}")
    assert restored.json()["n"] == 2 and restored.headers["x-sprout-start"] == "warm"
    evicted = w.client.request("POST", "old", "", b"{}")
    assert evicted.json()["n"] == 1 and evicted.headers["x-sprout-start"] == "cold"


def test_two_sites_from_one_template_parked_and_restored_see_only_their_own(parker):
    """Both pods restored from one template (the first lambda's made it), both parked and
    restored: each handler sees its own code and its own state, in a pod of its own."""
    parker.deploy_source("maker", COUNTER, **{"tag.txt": "maker"})
    parker.client.run("maker")
    assert wait_for(lambda: "gVisor template made" in parker.log()), parker.log()[-2000:]
    for name in ("left", "right"):
        parker.deploy_source(name, COUNTER + "secret = open('/handler/tag.txt').read() * 2\n", **{"tag.txt": name})
    for n in (1, 2):
        for name in ("left", "right"):
            assert parker.client.run(name) | {"pid": 0} == {"n": n, "pid": 0, "tag": name}
    assert parker.log().count("restored from its package set's template") >= 2
    park_and_wait(parker, 3)
    seen = {name: parker.client.run(name) for name in ("left", "right")}
    assert seen["left"]["n"] == 3 and seen["left"]["tag"] == "left"
    assert seen["right"]["n"] == 3 and seen["right"]["tag"] == "right"
    assert parking(parker)["restores"] >= 2
    # Each restored into a pod of its own (read from the log: either may be parked again by now).
    restored = dict(re.findall(r"parked gVisor pod restored lambda=(left|right) pod=(\d+)", parker.log()))
    assert set(restored) == {"left", "right"} and restored["left"] != restored["right"], restored


def caught(worker, seen, give_up):
    """Whether `seen()` came to hold (polled every millisecond) before `give_up()` did (the
    moment passed unseen)."""
    deadline = time.time() + 60
    while not seen():
        if give_up():
            return False
        assert time.time() < deadline, worker.log()[-3000:]
        time.sleep(0.001)
    return True


def kill_when(worker, seen, give_up):
    """SIGKILL the worker as soon as `seen()` holds; False, and nothing killed, when
    `give_up()` holds first."""
    if not caught(worker, seen, give_up):
        return False
    worker.process.kill()
    worker.process.wait()
    worker.process = None
    return True


def runsc_doing(worker, verb):
    """Whether one of the worker's runsc commands doing `verb` runs now (read from /proc:
    quicker than a pgrep on a loaded machine, where a restore lasts a tenth of a second)."""
    state = f"{worker.dir}/run/runsc-state"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"runsc") and verb.encode() in argv and any(state.encode() in a for a in argv):
            return True
    return False


def call_and_ignore(worker, name):
    """A request whose worker is killed under it: whatever it gets is not the point."""
    try:
        worker.client.run(name)
    except Exception:
        pass


def cleaned_and_restarted(worker):
    report = json.loads(subprocess.run([str(SPROUT), "worker", "cleanup", str(worker.dir)], capture_output=True,
                                       text=True, check=True).stdout)
    assert wait_for(lambda: gvisor_processes(worker) == [], 5), gvisor_processes(worker)
    assert worker.leftovers() == [], worker.leftovers()
    assert parked_images(worker) == []
    worker.start()
    assert worker.client.run("counter")["n"] == 1
    return report


@pytest.mark.parametrize("during", ["checkpoint", "restore"])
def test_a_kill_9_while_parking_or_restoring_leaves_nothing_after_cleanup(parker, during):
    """Each try catches the moment runsc checkpoints or restores the pod (a park follows every
    request here, and a restore every request after a park); a try that misses it, on a
    loaded machine, is made again."""
    parker.deploy_source("counter", COUNTER, **{"tag.txt": "a"})
    parker.client.run("counter")
    for attempt in range(1, 11):
        if during == "checkpoint":
            parks = parking(parker).get("parks", 0)
            if kill_when(parker, lambda: runsc_doing(parker, "checkpoint"), lambda parks=parks: parking(parker).get("parks", 0) > parks):
                break
            parker.client.run("counter")
        else:
            park_and_wait(parker, attempt)
            caller = threading.Thread(target=call_and_ignore, args=(parker, "counter"))
            caller.start()
            killed = kill_when(parker, lambda: runsc_doing(parker, "restore"), lambda caller=caller: not caller.is_alive())
            caller.join()
            if killed:
                break
    else:
        pytest.fail(f"no {during} caught in 10 tries")
    cleaned_and_restarted(parker)


def test_a_worker_stopped_while_parking_finishes_the_park_and_leaves_nothing(parker):
    """A SIGTERM while runsc checkpoints a pod: the shutdown waits for the park before it
    deletes the pods' containers and cgroups, then removes the image. (It once deleted the
    container under the checkpoint, and the park's failure, later, left a cgroup behind.)"""
    parker.deploy_source("counter", COUNTER, **{"tag.txt": "a"})
    parker.client.run("counter")
    for _ in range(10):
        parks = parking(parker).get("parks", 0)
        if caught(parker, lambda: parking(parker).get("parking_now", 0) > 0,
                  lambda parks=parks: parking(parker).get("parks", 0) > parks):
            break
        parker.client.run("counter")
    else:
        pytest.fail("no park caught under way in 10 tries")
    parker.stop()
    log = parker.log()
    assert "could not park" not in log, log[-3000:]
    assert log.index("shutting down") < log.rindex("gVisor pod parked"), log[-3000:]
    assert gvisor_processes(parker) == [] and parked_images(parker) == []
    assert parker.leftovers() == [], parker.leftovers()


SPIN = ("import time\n"
        "def f(e):\n"
        "    end = time.time() + e['seconds']\n"
        "    while time.time() < end:\n"
        "        pass\n"
        "    return 'spun'\n")


def test_a_request_that_finds_its_pod_being_parked_hurries_the_park(make_worker):
    """A park in the background runs on CPU time no other pod wants (its pod's CPU group
    idled): with every pod on one CPU and a neighbour's handler spinning there, it barely
    moves. A request for the pod being parked gives the park its weight back, so it waits
    for the park's work rather than for the neighbour; the restored handler kept its state."""
    w = make_worker(sandbox={"backend": "gvisor", "start_timeout_ms": 60000, "cpuset": "1"},
                    gvisor={"park_after_ms": 300, "pod_idle_ms": 500},
                    handler_cache={"pause_after_ms": 50}, limits={"timeout_ms": 90000})
    w.deploy_source("counter", COUNTER, **{"tag.txt": "a"})
    w.deploy_source("spin", SPIN)
    assert w.client.run("spin", {"seconds": 0}) == "spun"
    spinner = threading.Thread(target=w.client.run, args=("spin", {"seconds": 25}))
    spinner.start()
    try:
        assert w.client.run("counter")["n"] == 1
        assert wait_for(lambda: parking(w).get("parking_now", 0) >= 1, 30), (parking(w), w.log()[-3000:])
        time.sleep(1)
        assert parking(w)["parking_now"] >= 1, ("the park ended beside the spinning neighbour", parking(w))
        assert parking(w)["parks_hurried"] == 0
        assert w.client.run("counter")["n"] == 2
        stats = parking(w)
        assert stats["parks_hurried"] == 1 and stats["restores"] == 1, stats
        assert "sprout_gvisor_parks_hurried_total 1" in w.client.metrics()
    finally:
        spinner.join()


def test_the_resident_budget_parks_the_least_recently_used_pod_early(make_worker):
    """With room for about two running pods, a third lambda's start parks the pod idle
    longest (park_after is a minute here); that one's next request restores it, its state
    kept."""
    w = make_worker(sandbox={"backend": "gvisor", "start_timeout_ms": 60000},
                    gvisor={"park_after_ms": 60000, "resident_mb": 110, "templates": False},
                    handler_cache={"pause_after_ms": 50}, limits={"timeout_ms": 5000})
    for name in ("a", "b", "c"):
        w.deploy_source(name, COUNTER, **{"tag.txt": name})
    for name in ("a", "b"):
        assert w.client.run(name)["n"] == 1
        time.sleep(0.3)
    # (Room for the next pod is also made ahead, after each start: "a" may be parked already.)
    assert w.client.run("c")["n"] == 1
    # The park runs in the background (a second or more on a loaded host): wait for it.
    deadline = time.time() + 20
    while not (parking(w)["parks"] >= 1 and len(parked_images(w)) >= 1) and time.time() < deadline:
        time.sleep(0.1)
    assert parking(w)["parks"] >= 1 and len(parked_images(w)) >= 1, (parking(w), w.log()[-2000:])
    time.sleep(0.3)
    assert w.client.run("a")["n"] == 2
    assert parking(w)["restores"] == 1


def test_a_start_that_finds_no_room_waits_for_a_park_and_it_is_counted(make_worker):
    """With room for no pod, the second lambda's start parks the first one's idle pod and
    waits for it (room made ahead, after the first start, found nothing idle yet)."""
    w = make_worker(sandbox={"backend": "gvisor", "start_timeout_ms": 60000},
                    gvisor={"park_after_ms": 60000, "resident_mb": 1, "templates": False},
                    handler_cache={"pause_after_ms": 50}, limits={"timeout_ms": 5000})
    for name in ("a", "b"):
        w.deploy_source(name, COUNTER, **{"tag.txt": name})
    assert w.client.run("a")["n"] == 1
    time.sleep(0.5)
    assert parking(w).get("parks", 0) == 0, parking(w)
    assert w.client.run("b")["n"] == 1
    stats = parking(w)
    assert stats["parks_waited_for"] == 1 and stats["parks"] == 1 and len(parked_images(w)) == 1, stats
    assert w.client.run("a")["n"] == 2


SHARED_CODE = {
    "app.py": "import os\nIMPORT_PID = os.getpid()\nPREPARED = []\ndef prepare():\n    PREPARED.append(os.getpid())\n",
    "f.py": ("import os, app\n"
             "def f(e):\n"
             "    return {'site': open('/handler/site.toml').read(), 'prepared': bool(app.PREPARED),\n"
             "            'imported_before': app.IMPORT_PID != os.getpid()}\n"),
    "ol.yaml": "preload:\n  modules: [app]\n  call: app:prepare\n  settings: [site.toml]\n",
}


def test_lambdas_sharing_code_restore_from_one_template_with_it_loaded(make_worker):
    """ol.yaml's preload under gVisor: the pod's Zygote loads the shared code (imports its
    modules, calls its function) and the first lambda's pod has the codebase's template
    made; the next lambda of the codebase restores from it, the code already loaded, each
    reading only its own settings file."""
    w = make_worker(sandbox={"backend": "gvisor", "start_timeout_ms": 60000}, gvisor={"park_after_ms": 0})
    w.client.upload("one", targz({**SHARED_CODE, "site.toml": "one"}))
    assert w.client.run("one") == {"site": "one", "prepared": True, "imported_before": True}
    assert wait_for(lambda: "gVisor template made" in w.log()), w.log()[-2000:]
    w.client.upload("two", targz({**SHARED_CODE, "site.toml": "two"}))
    assert w.client.run("two") == {"site": "two", "prepared": True, "imported_before": True}
    assert "lambda=two" in w.log() and w.log().count("restored from its package set's template") == 1, w.log()[-3000:]
    assert w.client.run("one")["site"] == "one"
