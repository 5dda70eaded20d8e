"""Olio's two deployments, each started and stopped by one call.

On Sprout (the Olio lambda behind a worker's app port, the Sprout cache, PostgreSQL) and
conventional (nginx, gunicorn, memcached, PostgreSQL), confined to the CPUs asked for, with
their state in one directory.

    with olio_deploy.running("sprout", "/srv/olio-state", cpus="0", cache=True) as site:
        requests.get(site.url)          # also site.db_url, site.files

The command line is `python3 -m olio_deploy up|down|status` (and `sprout olio ...`); fleets
of sites on one port, told apart by Host, are `fleet-up|fleet-down|fleet-status` (fleet.py).
"""

import contextlib

from .deploy import Options, Site, down, status, up
from .procs import DeployError

__all__ = ["DeployError", "Options", "Site", "down", "running", "status", "up"]


@contextlib.contextmanager
def running(stack, state, cpus="0", cache=True, port=None, **options):
    """Bring the `stack` deployment up in `state` (on a free port unless `port`), yield its
    Site, and take it down again, whatever happens inside. Other keywords are `Options`'
    fields (users, seed, allow_small, files, workers, ...)."""
    from .procs import free_port

    site = up(Options(stack=stack, state=str(state), cpus=str(cpus), cache=cache, port=port or free_port(), **options))
    try:
        yield site
    finally:
        down(state)
