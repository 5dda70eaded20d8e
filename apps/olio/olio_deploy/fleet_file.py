"""Read and check a fleet file: the Olio sites a fleet deployment serves, one per host name.

The file is JSON that the fleet generator writes:

    {"version": 1, "seed": 1, "span_s": 300.0, "registered_users": 100,
     "sites": [{"name": "site0000", "host": "site0000.fleet.test", "peak_users": 2, ...}]}

Each site's name ([a-z0-9]+, at most 50 characters: it becomes a lambda, a database
`olio_<name>` and file names) and host (a DNS name, compared without case) must be unique.
Fields the deployment does not use (rate_per_day, trigger, sessions, mean_users, profile)
are kept as they are and not checked beyond their type.
"""

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from .procs import DeployError

NAME = re.compile(r"[a-z0-9]{1,50}\Z")
LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
MIN_USERS = 10  # olio.loader's SMALLEST


@dataclass(frozen=True)
class FleetSite:
    name: str
    host: str
    peak_users: float


@dataclass(frozen=True)
class Fleet:
    seed: int
    registered_users: int
    sites: tuple
    path: str

    @property
    def hosts(self):
        return [s.host for s in self.sites]


def valid_host(host):
    """A DNS name: dot-separated labels of letters, digits and '-' (not at a label's ends),
    at most 253 characters; lower case."""
    return isinstance(host, str) and 0 < len(host) <= 253 and all(LABEL.match(label) for label in host.split("."))


def load(path):
    """The Fleet in the file at `path`; a DeployError naming the mistake otherwise."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DeployError(f"--fleet {path}: no such file") from None
    except OSError as e:
        raise DeployError(f"--fleet {path}: {e.strerror}") from None
    except ValueError as e:
        raise DeployError(f"--fleet {path}: not JSON ({e})") from None
    return parse(data, str(path))


def parse(data, where="the fleet file"):
    def bad(message):
        return DeployError(f"{where}: {message}")

    if not isinstance(data, dict):
        raise bad("must be a JSON object")
    if data.get("version") != 1:
        raise bad(f"version {data.get('version')!r}: only version 1 is understood")
    seed, users = data.get("seed", 1), data.get("registered_users")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise bad(f"seed {seed!r} must be an integer")
    if not isinstance(users, int) or isinstance(users, bool) or users < MIN_USERS:
        raise bad(f"registered_users {users!r} must be an integer >= {MIN_USERS} (the users loaded into every site's "
                  "database; Olio's loader makes no smaller data set)")
    sites = data.get("sites")
    if not isinstance(sites, list) or not sites:
        raise bad("sites must be a non-empty list")
    names, hosts, out = {}, {}, []
    for i, site in enumerate(sites):
        at = f"sites[{i}]"
        if not isinstance(site, dict):
            raise bad(f"{at} must be an object")
        name, host = site.get("name"), site.get("host")
        if not isinstance(name, str) or not NAME.match(name):
            raise bad(f"{at}.name {name!r} must be 1-50 lower-case letters and digits ([a-z0-9]+)")
        if not isinstance(host, str) or not valid_host(host.lower()):
            raise bad(f"{at}.host {host!r} is not a DNS name (labels of a-z, 0-9 and '-', dot-separated)")
        host = host.lower()
        if name in names:
            raise bad(f"{at}.name {name!r} is also the name of sites[{names[name]}]")
        if host in hosts:
            raise bad(f"{at}.host {host!r} is also the host of sites[{hosts[host]}]")
        names[name], hosts[host] = i, i
        peak = site.get("peak_users", 1)
        if isinstance(peak, bool) or not isinstance(peak, (int, float)) or not math.isfinite(peak) or peak < 0:
            raise bad(f"{at}.peak_users {peak!r} must be a number >= 0")
        out.append(FleetSite(name, host, float(peak)))
    return Fleet(seed=seed, registered_users=users, sites=tuple(out), path=where)
