"""Time-varying load, beyond Cloudstone's always-on pricing: run load profiles (a compressed
day, a flash crowd) against both Olio stacks and price what each actually used under
per-second billing, beside the conventional stack provisioned for its peak.

Each (profile, stack) run deploys the stack fresh (`sprout olio up`, confined to --cpus),
drives it with `sprout load run --profile` (generator on --agent-cpus), and keeps run.json and
report.html under OUT/<profile>/<stack>/. The summary (profiles.json, profiles.md,
profiles.png in OUT) puts, per profile and stack: CPU-seconds on the deployment's CPUs, its
memory GB-seconds (PSS of its processes), the per-second cost of those, the SLA verdicts; and
the always-on cost of the conventional stack sized for the profile's peak, from the users one
instance serves at SLA-2 (bench/results/cloudstone.json, or --capacity).

usage: python3 bench/cloudstone_profiles.py [--profiles day flash-crowd] [--stacks sprout conventional]
       python3 bench/cloudstone_profiles.py --summarize-only     # re-summarize existing runs
"""

import argparse
import json
import math
import subprocess
import sys
import tomllib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from cloudstone_report import existing, read_json  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SPROUT = REPO / "target/release/sprout"
COLORS = {"sprout": "#2a9d8f", "conventional": "#e76f51"}
# The processes that run the application's code, in each stack: its sandboxes (and their
# Zygotes), or gunicorn's master and workers.
APP_KIND = {"sprout": "python helper.py", "conventional": "python -m gunicorn"}


def profile_points(path):
    points = []
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            t, u = line.split()
            points.append((float(t), int(u)))
    return points


def olio(*args):
    return subprocess.run([str(SPROUT), "olio", *args], check=True, capture_output=True, text=True).stdout


def run_one(profile, stack, out, a):
    points = profile_points(profile)
    peak = max(u for _, u in points)
    duration = points[-1][0] + a.tail
    registered = max(1000, peak * a.accounts_per_user)
    state = Path(a.state_root) / f"olio-profile-{stack}"
    subprocess.run([str(SPROUT), "olio", "down", "--dir", str(state)], capture_output=True)
    subprocess.run(["rm", "-rf", str(state)], check=True)
    print(f"==> {profile.stem} on {stack}: deploying ({registered} accounts)", flush=True)
    olio("up", "--stack", stack, "--cpus", a.cpus, "--port", str(a.port), "--users", str(registered), "--dir", str(state))
    try:
        status = json.loads(olio("status", "--dir", str(state)))
        cgroup = status["confinement"]["cgroup"]
        cmd = [str(SPROUT), "load", "run", "--url", f"http://127.0.0.1:{a.port}", "--registered-users", str(registered),
               "--profile", str(profile), "--ramp-up", "0", "--steady", str(duration), "--ramp-down", "0",
               "--window", str(a.window), "--interval", "5", "--agent-cpus", a.agent_cpus, "--sut-cpus", a.cpus,
               "--sut-cgroup", cgroup, "--deployment", str(state), "--stack", stack, "--out", str(out)]
        subprocess.run(cmd, check=True, cwd=REPO)
    finally:
        subprocess.run([str(SPROUT), "olio", "down", "--dir", str(state)], capture_output=True)


def hourly_price(name):
    prices = tomllib.loads((REPO / "bench/pricing.toml").read_text())["price"]
    return next(p for p in prices if p["name"] == name)["usd_per_instance_hour"]


def capacity(a):
    if a.capacity:
        return a.capacity
    summary = REPO / "bench/results/cloudstone.json"
    if summary.exists():
        return json.loads(summary.read_text())["stacks"]["conventional"]["sla2_users"]
    sys.exit("no --capacity and no bench/results/cloudstone.json: run the searches first")


def summarize(a, profiles):
    price = a.price
    cap = capacity(a)
    rows, runs = [], {}
    for profile in profiles:
        points = profile_points(profile)
        peak = max(u for _, u in points)
        for stack in a.stacks:
            path = existing(Path(a.out) / profile.stem / stack / "run.json")  # or run.json.gz
            if path is None:
                continue
            r = read_json(path)
            res = r["resources"]
            cost = res["costs"][price]
            instances = math.ceil(peak / cap)
            hourly = hourly_price(price)
            provisioned = instances * hourly * res["seconds"] / 3600
            pss_peak, pss_end = memory_peak_and_end(r, a.end_window)
            kinds_peak, kinds_end = kinds_at_peak_and_end(r, a.end_window)
            row = {
                "profile": profile.stem, "stack": stack, "peak_users": peak, "seconds": round(res["seconds"], 1),
                "pss_peak_mb": pss_peak, "pss_end_mb": pss_end,
                "pss_by_kind_peak_mb": kinds_peak, "pss_by_kind_end_mb": kinds_end,
                "cpu_seconds": round(res["cpu_seconds"], 1),
                "gb_seconds": None if res["gb_seconds"] is None else round(res["gb_seconds"], 1),
                "used_usd": cost["used_usd"], "sla1": r["sla1_passed"], "sla2": r["sla2_passed"], "ops_per_s": round(r["ops_per_s"], 2),
                "errors": sum(o["errors"] for o in r["operations"].values()),
                "conventional_peak_instances": instances, "provisioned_for_peak_usd": provisioned,
                "report": repo_relative(path.parent / "report.html"),
            }
            rows.append(row)
            runs[(profile.stem, stack)] = r
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profiles.json").write_text(json.dumps({"price": price, "conventional_users_per_instance_sla2": cap, "cpus": a.cpus,
                                                   "agent_cpus": a.agent_cpus, "runs": rows}, indent=2))
    lines = [f"Prices: `{price}` (per-second rates for what was used; per instance-hour for the provisioned stack). "
             f"The conventional stack serves {cap} users per 1-CPU instance at SLA-2; "
             f"deployment on CPU {a.cpus}, generator on CPU {a.agent_cpus}.", "",
             f"Memory is the PSS of every process of the deployment: its peak, and its mean over the last {a.end_window:.0f} s "
             "(after the burst).", "",
             "| profile | stack | peak users | CPU-s | GB-s | PSS peak, MiB | PSS at the end, MiB | used, per-second billing | "
             "conventional for peak (instances) | SLA-1 | SLA-2 | ops/s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|:-:|:-:|---:|"]
    for w in rows:
        used = "n/a" if w["used_usd"] is None else f"${w['used_usd']:.5f}"
        lines.append(f"| {w['profile']} | {w['stack']} | {w['peak_users']} | {w['cpu_seconds']} | {w['gb_seconds']} | "
                     f"{w['pss_peak_mb']} | {w['pss_end_mb']} | {used} | "
                     f"${w['provisioned_for_peak_usd']:.5f} ({w['conventional_peak_instances']}) | {'pass' if w['sla1'] else 'fail'} | "
                     f"{'pass' if w['sla2'] else 'fail'} | {w['ops_per_s']} |")
    lines += what_holds_the_memory(rows)
    lines += where_the_time_goes(runs)
    (out / "profiles.md").write_text("\n".join(lines) + "\n")
    plot(runs, out / "profiles.png")
    print("\n".join(lines))


def memory_peak_and_end(run, window):
    """The deployment's peak PSS and its mean over the run's last `window` seconds, MiB."""
    samples = [(u["t"], u["sut_pss_bytes"]) for u in run["utilization"] if u.get("sut_pss_bytes")]
    if not samples:
        return None, None
    end = samples[-1][0]
    tail = [b for t, b in samples if t >= end - window]
    return round(max(b for _, b in samples) / 2**20), round(sum(tail) / len(tail) / 2**20)


def kinds_at_peak_and_end(run, window):
    """PSS by kind of process (MiB): its mean while the most users were active, and over the
    run's last `window` seconds; None for runs sampled without the breakdown."""
    samples = [(u["t"], u["sut_pss_by_kind"]) for u in run["utilization"] if u.get("sut_pss_by_kind")]
    steps = run.get("active_users") or []
    if not samples or not steps:
        return None, None
    most = max(u for _, u in steps)
    spans = [(t, steps[i + 1][0] if i + 1 < len(steps) else math.inf) for i, (t, u) in enumerate(steps) if u == most]
    at_peak = [k for t, k in samples if any(a <= t < b for a, b in spans)] or [samples[-1][1]]
    end = samples[-1][0]
    tail = [k for t, k in samples if t >= end - window]
    kinds = sorted({k for s in at_peak + tail for k in s})
    mib = 2**20

    def mean(group):
        return {k: round(sum(s.get(k, 0) for s in group) / len(group) / mib) for k in kinds}

    return mean(at_peak), mean(tail)


def what_holds_the_memory(rows):
    """A table of PSS by kind of process at the peak and at the end, for runs that have it."""
    lines = []
    for w in rows:
        peak, end = w.get("pss_by_kind_peak_mb"), w.get("pss_by_kind_end_mb")
        if not peak:
            continue
        if not lines:
            lines = ["", "What held the memory: PSS by kind of process, MiB, its mean while the most users were "
                         "active and over the last seconds (kinds of 1 MiB or more):", "",
                     "| profile | stack | process | at the peak of users | at the end |", "|---|---|---|---:|---:|"]
        for kind in sorted(peak, key=lambda k: -max(peak[k], end.get(k, 0))):
            if max(peak[kind], end.get(kind, 0)) >= 1:
                lines.append(f"| {w['profile']} | {w['stack']} | {kind} | {peak[kind]} | {end.get(kind, 0)} |")
    return lines


def repo_relative(path):
    """`path` relative to the repository when it lies inside it (so results read the same
    on any clone), else as given."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def where_the_time_goes(runs):
    """CPU milliseconds per operation served, by kind of process, for each run."""
    lines = []
    for (profile, stack), r in sorted(runs.items()):
        by = r["resources"].get("cpu_seconds_by_process") or {}
        ops = sum(o["count"] + o["errors"] for o in r["operations"].values())
        if not by or not ops:
            continue
        if not lines:
            lines = ["", "Where the deployment's CPU time went, in CPU milliseconds per operation "
                         "(steady-state operations; every process of the deployment):", "",
                     "| profile | stack | process | CPU-ms per operation | share |", "|---|---|---|---:|---:|"]
        total = sum(by.values())
        for kind, sec in sorted(by.items(), key=lambda kv: -kv[1]):
            if sec / total >= 0.005:
                lines.append(f"| {profile} | {stack} | {kind} | {1000 * sec / ops:.2f} | {100 * sec / total:.1f}% |")
        counters = r.get("counters", {})
        served = ""
        if counters.get("http_requests"):
            served = (f" ({counters['http_requests'] / ops:.1f} HTTP requests per operation, "
                      f"{100 * counters.get('http_not_modified', 0) / counters['http_requests']:.0f}% answered 304)")
        lines.append(f"| {profile} | {stack} | **all**{served} | **{1000 * total / ops:.2f}** | 100% |")
    return lines


def plot(runs, path):
    names = sorted({p for p, _ in runs})
    if not names:
        return
    fig, axes = plt.subplots(3, len(names), figsize=(7 * len(names), 9), squeeze=False, sharex="col")
    for col, name in enumerate(names):
        for (p, stack), r in sorted(runs.items()):
            if p != name:
                continue
            color = COLORS.get(stack, "#264653")
            t, u = zip(*r["active_users"]) if r["active_users"] else ((), ())
            axes[0][col].step(t, u, where="post", color=color, label=stack)
            cpus = r["sut_cpus"]
            ts = [s["t"] for s in r["utilization"]]
            busy = [100 * sum(s["cpu_busy"][c] for c in cpus) / len(cpus) for s in r["utilization"]]
            axes[1][col].plot(ts, busy, color=color, linewidth=0.8, label=stack)
            axes[2][col].plot(ts, [(s.get("sut_pss_bytes") or 0) / 2**20 for s in r["utilization"]], color=color, label=stack)
            app = APP_KIND.get(stack)
            if app and any(s.get("sut_pss_by_kind") for s in r["utilization"]):
                held = [(s.get("sut_pss_by_kind") or {}).get(app, 0) / 2**20 for s in r["utilization"]]
                axes[2][col].plot(ts, held, color=color, linestyle="--", linewidth=1, label=f"{stack}: {app}")
        axes[0][col].set_title(f"{name}")
        axes[0][col].set_ylabel("active users")
        axes[1][col].set_ylabel("deployment CPU busy, %")
        axes[2][col].set_ylabel("deployment memory (PSS), MiB")
        axes[2][col].set_xlabel("seconds into the run")
        for row in axes:
            row[col].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profiles", nargs="+", default=["flash-crowd", "day"], help="names under bench/workloads/profiles/")
    p.add_argument("--stacks", nargs="+", default=["sprout", "conventional"])
    p.add_argument("--cpus", default="0")
    p.add_argument("--agent-cpus", default="1")
    p.add_argument("--port", type=int, default=8090)
    p.add_argument("--accounts-per-user", type=int, default=100)
    p.add_argument("--window", type=float, default=60.0, help="SLA window, seconds")
    p.add_argument("--tail", type=float, default=60.0, help="seconds run at the profile's last level")
    p.add_argument("--end-window", type=float, default=30.0, help="seconds at the end over which memory is averaged")
    p.add_argument("--price", default="m7g.medium-2026")
    p.add_argument("--capacity", type=int, help="users one conventional instance serves at SLA-2")
    p.add_argument("--state-root", default="/tmp")
    p.add_argument("--out", default=str(REPO / "bench/results/cloudstone/profiles"))
    p.add_argument("--summarize-only", action="store_true")
    a = p.parse_args()
    profiles = [REPO / "bench/workloads/profiles" / f"{n}.txt" for n in a.profiles]
    if not a.summarize_only:
        for profile in profiles:
            for stack in a.stacks:
                run_one(profile, stack, Path(a.out) / profile.stem / stack, a)
    summarize(a, profiles)


if __name__ == "__main__":
    main()
