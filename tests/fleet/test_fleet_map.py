"""`sprout.map` through a fleet (docs/offload.md): HAProxy hands a map's requests to its
workers one request at a time, so a map uses every worker of the fleet."""

import json
import re
import time
import urllib.request

import sprout
from fleet_helpers import sprout as sprout_cli
from fleet_helpers import start_fleet, stop_fleet

SQUARE = "def f(event):\n    return event * event\n"
ITEMS = 10_000
SMALL = 1_000
API_PORT = 5000  # each worker's, at its address (crates/fleet/src/plan.rs)


def map_items(address, token):
    """Items worker `address` ran for lambda square (its /metrics)."""
    req = urllib.request.Request(f"http://{address}/metrics", headers={"Authorization": f"Bearer {token}"})
    text = urllib.request.urlopen(req, timeout=30).read().decode()
    found = re.findall(r'^sprout_map_items_total\{lambda="square",outcome="ok"\} (\d+)', text, re.M)
    return int(found[0]) if found else 0


def test_a_map_through_haproxy_uses_every_worker_of_four(tmp_path):
    """Of 10,000 items and of 1,000: each worker takes at least 15%."""
    directory = tmp_path / "fleet"
    url, state = start_fleet(directory, 4, "package-aware")
    try:
        code = tmp_path / "square"
        code.mkdir()
        (code / "f.py").write_text(SQUARE)
        sprout_cli("fleet", "deploy", directory, code, "--name", "square")
        token = (directory / "api-token").read_text().strip()
        workers = json.loads(sprout_cli("fleet", "status", directory).stdout)["workers"]
        assert len(workers) == 4
        for w in workers:
            w["address"] = f"{w['address']}:{API_PORT}"
        deadline = time.time() + 30
        for w in workers:  # the shared registry brings the lambda to every worker
            while True:
                try:
                    urllib.request.urlopen(urllib.request.Request(f"http://{w['address']}/registry/square",
                                                                  headers={"Authorization": f"Bearer {token}"}), timeout=10)
                    break
                except OSError:
                    assert time.time() < deadline, f"worker {w['address']} never got the lambda"
                    time.sleep(0.2)
        client = sprout.Client(url, token=token)
        done = {w["address"]: 0 for w in workers}
        # A map of fewer items than one request can hold (2,048) is cut to spread as well.
        for items in (ITEMS, SMALL):
            assert list(sprout.map("square", range(items), client=client)) == [i * i for i in range(items)]
            ran = {w["address"]: map_items(w["address"], token) for w in workers}
            shares = {a: (ran[a] - done[a]) / items for a in ran}
            done = ran
            print(f"shares of {items} items by worker:", shares)
            assert abs(sum(shares.values()) - 1) < 1e-9, shares
            assert min(shares.values()) >= 0.15, f"a worker took less than 15% of {items} items: {shares}"
    finally:
        stop_fleet(directory, json.loads((directory / "fleet.json").read_text()))
