"""`sprout fleet`: several workers on this machine, each in its own network namespace on its
own CPU with its own memory budget, behind HAProxy from Debian's packages, sharing one
registry in the fleet's PostgreSQL (crates/fleet, crates/worker/src/shared_registry.rs)."""

import collections
import contextlib
import http.client
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import EXAMPLES, LAMBDAS, SPROUT, free_port
from fleet_helpers import leftovers, sprout, start_fleet, stop_fleet


@pytest.fixture
def fleet(tmp_path):
    """Three workers, lambdas routed by consistent hashing."""
    directory = tmp_path / "fleet"
    url, state = start_fleet(directory, 3, "consistent")
    yield directory, url, state
    stop_fleet(directory, json.loads((directory / "fleet.json").read_text()))


def get(url, timeout=30):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.headers.get("x-sprout-worker"), r.read()


@contextlib.contextmanager
def hello_load(url, clients):
    """`clients` threads GETting /run/hello/ada through the fleet while the block runs; yields
    the count of each outcome (200, or the failure) and of each worker that served."""
    outcomes, served, stop = collections.Counter(), collections.Counter(), threading.Event()

    def load():
        while not stop.is_set():
            try:
                status, worker, _ = get(f"{url}/run/hello/ada")
                outcomes[status] += 1
                served[worker] += 1
            except Exception as e:  # every failure is counted, none expected
                outcomes[repr(e)[:100]] += 1

    threads = [threading.Thread(target=load) for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        yield outcomes, served
    finally:
        stop.set()
        for t in threads:
            t.join()


def test_three_workers_serve_lambdas_through_haproxy_each_lambda_mostly_on_its_worker(fleet, tmp_path):
    directory, url, state = fleet
    names = {f"f{state['plan']['tag']}{m['name']}" for m in state["members"]}
    status = json.loads(sprout("fleet", "status", directory).stdout)
    assert status["haproxy"] and [w["ready"] for w in status["workers"]] == [True] * 3
    assert len({w["address"] for w in status["workers"]}) == 3 and len({w["netns"] for w in status["workers"]}) == 3
    sprout("fleet", "deploy", directory, EXAMPLES / "hello")
    for i in range(12):
        sprout("fleet", "deploy", directory, EXAMPLES / "echo", "--name", f"echo{i}")
    assert get(f"{url}/run/hello/ada")[2] == b"<h1>Hello, ada!</h1>\n"
    homes = {}
    for i in range(12):
        # Bounded loads: at this load one request in flight fills a worker, and a request
        # is sent past a worker still counting the previous one (over separate connections,
        # until HAProxy sees the last close; once in 120 over one connection, under load).
        # Round robin would send at most 4 of 10 to one worker.
        conn = http.client.HTTPConnection(urllib.parse.urlsplit(url).netloc, timeout=30)
        served = collections.Counter()
        for _ in range(10):
            conn.request("GET", f"/run/echo{i}")
            reply = conn.getresponse()
            reply.read()
            assert reply.status == 200
            served[reply.headers.get("x-sprout-worker")] += 1
        conn.close()
        home, count = served.most_common(1)[0]
        assert count >= 7 and set(served) <= names, f"echo{i} went to {served} (consistent hashing keeps a lambda on its worker)"
        homes[f"echo{i}"] = home
    assert len(set(homes.values())) >= 2, f"twelve lambdas all hashed to one worker: {homes}"


def test_killing_a_worker_loses_no_idempotent_request(fleet):
    directory, url, state = fleet
    sprout("fleet", "deploy", directory, EXAMPLES / "hello")
    home = get(f"{url}/run/hello/ada")[1]
    victim = next(m for m in state["members"] if home.endswith(m["name"]))
    with hello_load(url, 4) as (outcomes, served):
        time.sleep(1.5)
        os.kill(int((directory / victim["name"] / "worker.pid").read_text()), signal.SIGKILL)
        time.sleep(3)
    assert set(outcomes) == {200}, outcomes
    assert len(served) >= 2, f"the load never left the killed worker: {served}"
    status = json.loads(sprout("fleet", "status", directory).stdout)
    assert [(w["ready"], w["haproxy"]) for w in status["workers"] if w["name"] == victim["name"]] == [(False, "DOWN")]
    assert all(w["haproxy"] == "UP" for w in status["workers"] if w["name"] != victim["name"])


def test_fleet_commands_say_what_is_wrong(tmp_path):
    directory = tmp_path / "nofleet"
    (tmp_path / "sets-registry.toml").write_text('[registry]\nshared = "postgresql://elsewhere/x"\n')
    (tmp_path / "broken.toml").write_text("[limits\n")
    for args, words in [
        (("fleet", "up", directory, "--workers", 0), "at least one worker"),
        (("fleet", "up", directory, "--policy", "random"), "unknown routing policy"),
        (("fleet", "status", directory), "no fleet is up"),
        (("fleet", "deploy", directory, EXAMPLES / "echo"), "no fleet is up"),
        (("fleet", "up", directory, "--service", "olio-db"), "expected NAME=[ADDR:]PORT"),
        (("fleet", "up", directory, "--service", "db=70000"), "expected NAME=[ADDR:]PORT"),
        (("fleet", "up", directory, "--worker-config", tmp_path / "sets-registry.toml"), "sets registry.shared"),
        (("fleet", "up", directory, "--worker-config", tmp_path / "broken.toml"), "not valid TOML"),
        (("fleet", "up", directory, "--worker-config", tmp_path / "missing.toml"), "missing.toml"),
    ]:
        run = sprout(*args, check=False)
        assert run.returncode == 1 and words in run.stderr, (args, run.stderr)
    assert "no fleet is up" in sprout("fleet", "down", directory).stderr
    assert not (directory / "fleet.json").exists(), "a refused start-up records nothing"


def test_a_second_up_in_the_same_directory_is_refused(fleet):
    directory, _, _ = fleet
    again = sprout("fleet", "up", directory, check=False)
    assert again.returncode == 1 and "already up" in again.stderr


def put(url, token, data):
    request = urllib.request.Request(url, data=data, method="POST", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


def delete(url, token):
    request = urllib.request.Request(url, method="DELETE", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


def served_by_every_worker(state, path):
    """What each worker answers for `path`, asked directly at its own address."""
    answers = []
    for m in state["members"]:
        try:
            answers.append(get(f"http://{m['addr']}:5000{path}", timeout=10)[2])
        except urllib.error.HTTPError as e:
            answers.append(e.code)
    return answers


SPREAD_BOUND_S = 5  # crates/fleet/src/control.rs, SPREAD_BOUND


def test_code_replaced_or_deleted_through_one_worker_reaches_every_worker_within_the_bound(fleet):
    from conftest import targz

    directory, url, state = fleet
    token = (directory / "api-token").read_text().strip()
    first, second, third = (f"http://{m['addr']}:5000" for m in state["members"])
    put(f"{first}/registry/version", token, targz({"f.py": "def f(event):\n    return 'v1'\n"}))
    deadline = time.time() + SPREAD_BOUND_S
    while served_by_every_worker(state, "/run/version") != [b'"v1"'] * 3:
        assert time.time() < deadline, served_by_every_worker(state, "/run/version")
        time.sleep(0.05)
    started = time.time()
    put(f"{second}/registry/version", token, targz({"f.py": "def f(event):\n    return 'v2'\n"}))
    while served_by_every_worker(state, "/run/version") != [b'"v2"'] * 3:
        assert time.time() - started < SPREAD_BOUND_S, served_by_every_worker(state, "/run/version")
        time.sleep(0.05)
    started = time.time()
    delete(f"{third}/registry/version", token)
    while served_by_every_worker(state, "/run/version") != [404] * 3:
        assert time.time() - started < SPREAD_BOUND_S, served_by_every_worker(state, "/run/version")
        time.sleep(0.05)
    # The operator's isolation class travels with the code (the fleet's workers run sock only).
    put(f"{first}/registry/classed?isolation=sock", token, targz({"f.py": "def f(event):\n    return 1\n"}))
    put(f"{second}/registry/classed", token, targz({"f.py": "def f(event):\n    return 2\n"}))
    started = time.time()
    while classes_of_every_worker(state, token, "classed") != [(2, "sock", "sock")] * 3:
        assert time.time() - started < SPREAD_BOUND_S, classes_of_every_worker(state, token, "classed")
        time.sleep(0.05)


def classes_of_every_worker(state, token, name):
    """Each worker's (version's reply, isolation chosen, backend) of lambda `name`."""
    seen = []
    for m in state["members"]:
        base = f"http://{m['addr']}:5000"
        request = urllib.request.Request(f"{base}/registry/{name}", headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                meta = json.loads(r.read())
            seen.append((json.loads(get(f"{base}/run/{name}", timeout=10)[2]), meta.get("isolation"), meta.get("backend")))
        except urllib.error.HTTPError as e:
            seen.append(e.code)
    return seen


def test_a_worker_answers_ready_only_once_it_has_every_lambda_of_the_fleet(fleet):
    """HAProxy routes to a worker once /status answers: a worker that starts with an empty
    registry (a new member, or one whose disk was lost) must not say ready before it has
    unpacked the fleet's lambdas, or requests for them meet a 404."""
    from conftest import targz

    directory, _, state = fleet
    token = (directory / "api-token").read_text().strip()
    first = f"http://{state['members'][0]['addr']}:5000"
    names = [f"catchup{i}" for i in range(40)]
    for name in names:
        put(f"{first}/registry/{name}", token, targz({"f.py": f"def f(event):\n    return {name!r}\n"}))
    last = state["members"][-1]
    worker_dir = directory / last["name"]
    sprout("worker", "down", worker_dir)
    subprocess.run(["rm", "-rf", worker_dir / "registry"], check=True)
    subprocess.run(["nsenter", f"--net=/run/netns/{last['netns']}", SPROUT, "worker", "up", worker_dir, "--detach"],
                   check=True, capture_output=True, timeout=120)
    answers = {}
    for name in names:
        try:
            answers[name] = json.loads(get(f"http://{last['addr']}:5000/run/{name}", timeout=30)[2])
        except urllib.error.HTTPError as e:
            answers[name] = e.code
    assert answers == {name: name for name in names}, {k: v for k, v in answers.items() if v != k}


def test_an_upload_the_shared_registry_cannot_take_is_refused_with_its_reason(fleet):
    from conftest import targz

    directory, _, state = fleet
    token = (directory / "api-token").read_text().strip()
    data = f"/var/lib/sprout/fleet-pg/{state['plan']['tag']}"
    pg_ctl = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))[-1]
    subprocess.run(["runuser", "-u", "postgres", "--", str(pg_ctl), "-D", data, "-m", "fast", "-w", "stop"], check=True,
                   capture_output=True, cwd="/")
    first = f"http://{state['members'][0]['addr']}:5000"
    with pytest.raises(urllib.error.HTTPError) as refused:
        put(f"{first}/registry/lonely", token, targz({"f.py": "def f(event):\n    return 1\n"}))
    body = json.loads(refused.value.read())
    assert refused.value.code == 503 and body["error"] == "shared_registry_unavailable", body
    assert "upload it again" in body["message"]


def test_a_worker_added_under_load_takes_traffic_and_a_drained_one_finishes_its_requests(tmp_path):
    directory = tmp_path / "fleet"
    url, state = start_fleet(directory, 2, "round-robin")
    try:
        sprout("fleet", "deploy", directory, EXAMPLES / "hello")
        sprout("fleet", "deploy", directory, LAMBDAS / "sleepy")
        with hello_load(url, 3) as (outcomes, served):
            time.sleep(1)
            added = sprout("fleet", "add", directory).stdout.split()[0]
            time.sleep(2)
        assert set(outcomes) == {200}, outcomes
        assert served[f"f{state['plan']['tag']}{added}"] > 0, f"the added worker {added} took no requests: {served}"

        slow = collections.Counter()

        def sleep_request():
            request = urllib.request.Request(f"{url}/run/sleepy", data=b'{"seconds": 2}', method="POST")
            try:
                with urllib.request.urlopen(request, timeout=30) as r:
                    slow[(r.status, r.headers.get("x-sprout-worker"))] += 1
            except Exception as e:
                slow[repr(e)[:100]] += 1

        sleepers = [threading.Thread(target=sleep_request) for _ in range(6)]
        for t in sleepers:
            t.start()
        time.sleep(0.5)
        sprout("fleet", "drain", directory, "w2")
        for t in sleepers:
            t.join()
        drained = f"f{state['plan']['tag']}w2"
        assert all(isinstance(k, tuple) and k[0] == 200 for k in slow), slow
        assert slow[(200, drained)] > 0, f"no request under way on w2 when it was drained: {slow}"
        status = json.loads(sprout("fleet", "status", directory).stdout)
        assert [w["name"] for w in status["workers"]] == ["w1", added]
        assert get(f"{url}/run/hello/ada")[0] == 200
    finally:
        stop_fleet(directory, json.loads((directory / "fleet.json").read_text()))
    assert not [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if n.endswith(f"{state['plan']['tag']}-w2")]


def test_draining_says_what_is_wrong(fleet):
    directory, _, _ = fleet
    missing = sprout("fleet", "drain", directory, "w9", check=False)
    assert missing.returncode == 1 and "no worker \"w9\"" in missing.stderr and "w1, w2, w3" in missing.stderr


def test_package_aware_routing_sends_lambdas_sharing_a_package_to_one_worker(tmp_path, wheel_dir):
    directory = tmp_path / "fleet"
    config = tmp_path / "worker.toml"
    config.write_text(f'[packages]\nwheel_dir = "{wheel_dir}"\noffline = true\n')
    port = free_port()
    up = sprout("fleet", "up", directory, "--workers", 3, "--cpus", "0,1", "--memory-mb", 384, "--policy", "package-aware",
                "--listen", f"127.0.0.1:{port}", "--worker-config", config, check=False)
    assert up.returncode == 0, up.stderr
    state = json.loads((directory / "fleet.json").read_text())
    try:
        token = (directory / "api-token").read_text().strip()
        lambdas = [("big1", "bigpkg==1.0\n"), ("big2", "bigpkg==1.0\ngamma==1.0\n"), ("big3", "BigPkg==1.0\n"), ("plain", "")]
        for i, (name, requirements) in enumerate(lambdas):
            lambda_dir = tmp_path / name
            lambda_dir.mkdir()
            (lambda_dir / "f.py").write_text("def f(event):\n    return 1\n")
            if requirements:
                (lambda_dir / "requirements.txt").write_text(requirements)
            if i % 2:  # uploaded straight to the entry point, as `sprout deploy --url` does
                sprout("deploy", lambda_dir, "--url", f"http://127.0.0.1:{port}", "--token", token)
            else:
                sprout("fleet", "deploy", directory, lambda_dir)
        # Routed by the largest installed package (3 MiB bigpkg, not gamma), whichever worker
        # took the upload; a route reaches HAProxy once the packages are installed.
        deadline = time.monotonic() + 60
        while (routes := json.loads(sprout("fleet", "status", directory).stdout)["routes"]) != {
                "big1": "bigpkg==1.0", "big2": "bigpkg==1.0", "big3": "bigpkg==1.0"} and time.monotonic() < deadline:
            time.sleep(0.2)
        assert routes == {"big1": "bigpkg==1.0", "big2": "bigpkg==1.0", "big3": "bigpkg==1.0"}, routes
        # A worker added now gets them too (HAProxy's reload reads the routes the workers set).
        sprout("fleet", "add", directory)
        assert json.loads(sprout("fleet", "status", directory).stdout)["routes"] == routes
        homes = set()
        for name in ("big1", "big2", "big3"):
            served = collections.Counter(get(f"http://127.0.0.1:{port}/run/{name}")[1] for _ in range(6))
            home, count = served.most_common(1)[0]
            assert count >= 4, f"{name} went to {served}"
            homes.add(home)
        assert len(homes) == 1, f"lambdas sharing bigpkg went to {homes}"
    finally:
        stop_fleet(directory, json.loads((directory / "fleet.json").read_text()))
    assert leftovers(directory, state) == []
