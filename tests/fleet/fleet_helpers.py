"""Helpers of the fleet tests: run `sprout`, start and stop a fleet and find what it left behind."""

import json
import subprocess
import time

from conftest import SPROUT, free_port


def sprout(*args, check=True, timeout=300):
    return subprocess.run([str(SPROUT), *map(str, args)], capture_output=True, text=True, check=check, timeout=timeout)


def leftovers(directory, state):
    """Namespaces, links, the services address, HAProxy and worker processes of the fleet that still exist."""
    tag = state["plan"]["tag"]
    left = [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split() if tag in n]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    left += [line.split(":")[1].strip() for line in links.splitlines() if f"sf{tag}" in line]
    addresses = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    left += [line for line in addresses.splitlines() if f"sf{tag}" in line]
    procs = subprocess.run(["pgrep", "-af", f"{directory}|fleet-pg/{tag}"], capture_output=True, text=True).stdout
    return left + [p for p in procs.splitlines() if "pgrep" not in p]


def stop_fleet(directory, state):
    down = sprout("fleet", "down", directory, check=False)
    assert down.returncode == 0, down.stderr
    # A namespace's links and a process's last exit finish a moment after `down` returns.
    deadline = time.time() + 10
    while (left := leftovers(directory, state)) and time.time() < deadline:
        time.sleep(0.2)
    assert left == [], f"the fleet left {left}"
    assert not (directory / "fleet.json").exists()


def start_fleet(directory, workers, policy):
    """`sprout fleet up` in `directory`: (HAProxy's URL, the fleet's state)."""
    port = free_port()
    up = sprout("fleet", "up", directory, "--workers", workers, "--cpus", "0,1", "--memory-mb", 384, "--policy", policy,
                "--listen", f"127.0.0.1:{port}", check=False)
    assert up.returncode == 0, up.stderr
    return f"http://127.0.0.1:{port}", json.loads((directory / "fleet.json").read_text())
