"""The command line: `python3 -m olio_deploy up|down|status|fleet-up|fleet-down|fleet-status` (behind `sprout olio`)."""

import argparse
import json
import sys

from . import deploy, fleet
from .procs import DeployError


def parser():
    p = argparse.ArgumentParser(prog="sprout olio", description="Olio's two deployments, each started and stopped by one command.")
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start a deployment and print its URL")
    up.add_argument("--stack", required=True, choices=sorted(deploy.STACKS), help="sprout: the Olio lambda on a Sprout worker; "
                    "sprout-gvisor: the same in a gVisor sandbox; conventional: nginx + gunicorn")
    up.add_argument("--dir", required=True, help="the state directory (database, file store, configs, logs, pids)")
    up.add_argument("--cpus", default="0", help="CPUs every process of the deployment runs on (e.g. 0, 0,1, 0-3; default 0)")
    up.add_argument("--port", type=int, default=8080, help="the site's port (default 8080)")
    up.add_argument("--bind", default="127.0.0.1", help="the site's address (default 127.0.0.1)")
    up.add_argument("--cache", choices=["on", "off"], default="on",
                    help="the cache tier: the Sprout cache or memcached (default on)")
    scale = up.add_mutually_exclusive_group()
    scale.add_argument("--users", type=int, help="load this many users first, if the database is empty")
    scale.add_argument("--concurrent", type=int, help="or load for this many concurrent users (100 users each)")
    up.add_argument("--seed", type=int, default=1, help="the loader's seed (default 1)")
    up.add_argument("--allow-small", action="store_true", help="let the loader make fewer than 1,000 users")
    up.add_argument("--files", help="the file store (default STATE/files); both stacks may share one")
    up.add_argument("--workers", type=int, help="app processes: gunicorn workers, or Sprout sandboxes for the "
                    "lambda (default 2 x cores + 1)")
    up.add_argument("--cache-mb", type=int, default=256, help="memory of the cache server (default 256)")
    up.add_argument("--app-dir", help="the directory holding the olio package (default: the repository's apps/olio)")
    up.add_argument("--package-cache", default="/var/cache/sprout/packages",
                    help="the Sprout worker's install cache, shared by deployments (default %(default)s)")
    up.add_argument("--network", choices=["isolated", "shared"], default="isolated",
                    help="Sprout: the Olio lambda in a network of its own reaching only its services (default), "
                    "or the host's network as SOCK's sandboxes had (to measure what isolation costs)")
    up.add_argument("--gvisor-network", choices=["sandbox", "host"], default="sandbox",
                    help="sprout-gvisor: the lambda's network through gVisor's own stack (default) or the host "
                    "kernel's, inside the lambda's namespace ([gvisor] network)")
    up.add_argument("--wait", type=float, default=900, help="seconds to wait for the site's first 200 (default 900)")

    for name, text in (("down", "stop everything of a deployment"), ("status", "report on a deployment as JSON "
                                                                            "(exit 0 up, 3 down, 4 part of it runs)")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--dir", required=True, help="the state directory")

    fleet_up = sub.add_parser("fleet-up", help="start a fleet of sites on one port (by Host) and print one line of JSON")
    fleet_up.add_argument("--stack", required=True, choices=list(fleet.STACKS),
                          help="sprout: a lambda per site on one Sprout worker; sprout-runc: the same with a runc "
                          "container per sandbox; sprout-gvisor: a gVisor sandbox per site; "
                          "conventional: nginx + a gunicorn per site, always running; conventional-ondemand: nginx + "
                          "uWSGI's Emperor, a vassal per site started at its first request and stopped when idle")
    fleet_up.add_argument("--dir", required=True, help="the state directory (database, file store, configs, logs, pids)")
    fleet_up.add_argument("--fleet", required=True, help="the fleet file (JSON: version, seed, registered_users, sites)")
    fleet_up.add_argument("--cpus", default="0", help="CPUs every process of the fleet runs on (default 0)")
    fleet_up.add_argument("--port", type=int, default=8080, help="the one port of every site (default 8080)")
    fleet_up.add_argument("--bind", default="127.0.0.1", help="its address (default 127.0.0.1)")
    fleet_up.add_argument("--memory-mb", type=int, default=2048,
                          help="the memory budget of the whole deployment, MiB (default 2048)")
    fleet_up.add_argument("--wait", type=float, default=900, help="seconds to wait for the sites' first 200s (default 900)")
    fleet_up.add_argument("--fresh", action="store_true",
                          help="copy every site's database again from the template (default: keep existing ones)")
    fleet_up.add_argument("--app-dir", help="the directory holding the olio package (default: the repository's apps/olio)")
    fleet_up.add_argument("--package-cache", default="/var/cache/sprout/packages",
                          help="the Sprout worker's install cache (default %(default)s)")
    fleet_up.add_argument("--vassal-idle", metavar="SECONDS",
                          help="conventional-ondemand: a site's vassal stops after this many seconds without a request "
                          "(default 60)")
    fleet_up.add_argument("--vassal-processes", metavar="auto|N",
                          help="conventional-ondemand: each vassal's processes, auto (the fewest that meet the site's "
                          "peak, as the conventional stack's gunicorns) or a number (default auto)")
    for name, text in (("fleet-down", "stop everything of a fleet"),
                       ("fleet-status", "report on a fleet as JSON (exit 0 up, 3 down, 4 part of it runs)")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--dir", required=True, help="the state directory")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        if args.command == "up":
            options = deploy.Options(
                stack=args.stack, state=args.dir, cpus=args.cpus, port=args.port, bind=args.bind, cache=args.cache == "on",
                users=args.users, concurrent=args.concurrent, seed=args.seed, allow_small=args.allow_small, files=args.files,
                workers=args.workers, cache_mb=args.cache_mb, app_dir=args.app_dir, package_cache=args.package_cache,
                network=args.network, gvisor_network=args.gvisor_network,
                wait_s=args.wait)
            site = deploy.up(options)
            print(site.url)
            return 0
        if args.command == "fleet-up":
            options = fleet.FleetOptions(
                stack=args.stack, state=args.dir, fleet=args.fleet, cpus=args.cpus, port=args.port, bind=args.bind,
                memory_mb=args.memory_mb, wait_s=args.wait, fresh=args.fresh, app_dir=args.app_dir,
                package_cache=args.package_cache, vassal_idle=args.vassal_idle, vassal_processes=args.vassal_processes)
            print(json.dumps(fleet.up(options)), flush=True)
            return 0
        if args.command == "fleet-down":
            stopped = fleet.down(args.dir)
            print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
            return 0
        if args.command == "fleet-status":
            report, code = fleet.status(args.dir)
            print(json.dumps(report, indent=2))
            return code
        if args.command == "down":
            stopped = deploy.down(args.dir)
            print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
            return 0
        report, code = deploy.status(args.dir)
        print(json.dumps(report, indent=2))
        return code
    except DeployError as e:
        print(f"sprout olio {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
