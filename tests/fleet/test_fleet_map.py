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
API_PORT = 5000  # each worker's, at its address (crates/fleet/src/plan.rs)


def map_items(address, token):
    """Items worker `address` ran for lambda square (its /metrics)."""
    req = urllib.request.Request(f"http://{address}/metrics", headers={"Authorization": f"Bearer {token}"})
    text = urllib.request.urlopen(req, timeout=30).read().decode()
    found = re.findall(r'^sprout_map_items_total\{lambda="square",outcome="ok"\} (\d+)', text, re.M)
    return int(found[0]) if found else 0


def test_a_map_through_haproxy_uses_every_worker_of_four(tmp_path):
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
        assert list(sprout.map("square", range(ITEMS), client=client)) == [i * i for i in range(ITEMS)]
        shares = {w["address"]: map_items(w["address"], token) / ITEMS for w in workers}
        print("shares of the items by worker:", shares)
        assert abs(sum(shares.values()) - 1) < 1e-9, shares
        assert min(shares.values()) >= 0.15, f"a worker took less than 15% of the items: {shares}"
    finally:
        stop_fleet(directory, json.loads((directory / "fleet.json").read_text()))
