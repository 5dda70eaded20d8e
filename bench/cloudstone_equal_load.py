"""What each part of a deployment costs at the same load: Olio on Sprout with the lambda in its
own network namespace (the default), on Sprout sharing the host's network (`sprout olio up
--network shared`), and on the conventional stack, each at the same user count, in rounds
that alternate the order (so drift on a shared host falls on every configuration alike).
The difference between the two Sprout runs is what network isolation costs Olio.

Each run deploys fresh (`sprout olio up`, confined to --cpus, the database loaded at the
scale of the users), drives it (`sprout load run`, generator on --agent-cpus; a 120 s steady
state by default: on this shared host the CPU an operation costs drifts by up to 15% between
runs minutes apart, so several short interleaved rounds measure a difference better than a
few long ones), and keeps run.json and report.html under OUT/<config>/round-<k>/. The summary
(equal-load.json, equal-load.md, equal-load.png in OUT) gives per configuration the median
over rounds of CPU milliseconds per operation by part (as bench/cloudstone_breakdown.py
counts them), the deployment's CPU busy share, and the SLA verdicts of every round.

usage: python3 bench/cloudstone_equal_load.py [--users 1000] [--rounds 4] [--steady 120]
       python3 bench/cloudstone_equal_load.py --summarize-only
"""

import argparse
import json
import statistics
import subprocess
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from cloudstone_breakdown import PARTS, per_operation  # noqa: E402
from cloudstone_report import existing, read_json  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SPROUT = REPO / "target/release/sprout"
# name: (stack, extra `sprout olio up` arguments, label)
CONFIGS = {
    "sprout": ("sprout", ["--network", "isolated"], "Sprout, lambda in its own network (default)"),
    "sprout-shared": ("sprout", ["--network", "shared"], "Sprout, lambda on the host's network"),
    "conventional": ("conventional", [], "conventional (nginx + gunicorn)"),
}
COLORS = ["#2a9d8f", "#e9c46a", "#e76f51", "#264653", "#8d99ae"]


def olio(*args, check=True):
    return subprocess.run([str(SPROUT), "olio", *args], check=check, capture_output=True, text=True).stdout


def run_one(config, out, a):
    stack, up_args, _ = CONFIGS[config]
    registered = max(1000, a.users * a.accounts_per_user)
    state = Path(a.state_root) / f"olio-equal-load-{config}"
    olio("down", "--dir", str(state), check=False)
    subprocess.run(["rm", "-rf", str(state)], check=True)
    print(f"==> {config}: deploying ({registered} accounts)", flush=True)
    olio("up", "--stack", stack, *up_args, "--cpus", a.cpus, "--port", str(a.port), "--users", str(registered), "--dir", str(state))
    try:
        cgroup = json.loads(olio("status", "--dir", str(state)))["confinement"]["cgroup"]
        cmd = [str(SPROUT), "load", "run", "--url", f"http://127.0.0.1:{a.port}", "--users", str(a.users),
               "--registered-users", str(registered), "--ramp-up", str(a.ramp_up), "--steady", str(a.steady),
               "--ramp-down", str(a.ramp_down), "--agent-cpus", a.agent_cpus, "--sut-cpus", a.cpus, "--sut-cgroup", cgroup,
               "--deployment", str(state), "--stack", stack, "--seed", str(a.seed), "--out", str(out)]
        subprocess.run(cmd, check=True, cwd=REPO)
    finally:
        olio("down", "--dir", str(state), check=False)


def sut_busy(run):
    samples, cpus = run["utilization"], run["sut_cpus"]
    return sum(s["cpu_busy"][c] for s in samples for c in cpus) / max(1, len(samples) * len(cpus))


def paired_ratios(config, base):
    """Each round's total CPU per operation over the conventional stack's in the same round
    (rounds alternate the order, so a pair ran minutes apart)."""
    by_round = {Path(r["run"]).parent.name: r["all"] for r in base["rounds"]}
    return [r["all"] / by_round[Path(r["run"]).parent.name] for r in config["rounds"] if Path(r["run"]).parent.name in by_round]


def summarize(out):
    configs = {}
    for name in CONFIGS:
        rounds = []
        for path in sorted(filter(None, (existing(d / "run.json") for d in (out / name).glob("round-*")))):
            run = read_json(path)
            parts, ops = per_operation(run)
            rounds.append({"run": str(path.relative_to(REPO) if path.is_relative_to(REPO) else path), "users": run["users"],
                           "operations": ops, "ops_per_s": run["ops_per_s"], "cpu_ms_per_op": parts,
                           "all": sum(parts.values()), "sut_busy": sut_busy(run),
                           "sla1": run["sla1_passed"], "sla2": run["sla2_passed"]})
        if rounds:
            names = sorted({p for r in rounds for p in r["cpu_ms_per_op"]})
            configs[name] = {
                "label": CONFIGS[name][2], "rounds": rounds,
                "median_cpu_ms_per_op": {p: statistics.median(r["cpu_ms_per_op"].get(p, 0.0) for r in rounds) for p in names},
                "median_all": statistics.median(r["all"] for r in rounds),
                "median_sut_busy": statistics.median(r["sut_busy"] for r in rounds),
            }
    if not configs:
        raise SystemExit(f"no runs under {out}")
    users = sorted({r["users"] for c in configs.values() for r in c["rounds"]})
    base = configs.get("conventional", {}).get("median_all")
    lines = [f"CPU milliseconds per operation at {', '.join(map(str, users))} users, median of "
             f"{max(len(c['rounds']) for c in configs.values())} alternating rounds, each on a fresh deployment "
             "(`python3 bench/cloudstone_equal_load.py`):", "",
             "| part | " + " | ".join(c["label"] for c in configs.values()) + " |", "|---|" + "---:|" * len(configs)]
    for part in [p for p, _ in PARTS] + ["other"]:
        cells = [c["median_cpu_ms_per_op"].get(part) for c in configs.values()]
        if any(cells):
            lines.append(f"| {part} | " + " | ".join(f"{x or 0:.2f}" for x in cells) + " |")
    lines.append("| **all** | " + " | ".join(f"**{c['median_all']:.2f}**" for c in configs.values()) + " |")
    if base:
        lines.append("| ÷ conventional | " + " | ".join(f"{c['median_all'] / base:.2f}×" for c in configs.values()) + " |")
    lines.append("| range over rounds (all) | " + " | ".join(
        f"{min(r['all'] for r in c['rounds']):.2f}-{max(r['all'] for r in c['rounds']):.2f}" for c in configs.values()) + " |")
    if "conventional" in configs:
        paired = {name: paired_ratios(c, configs["conventional"]) for name, c in configs.items()}
        lines.append("| ÷ conventional, round by round (median) | " + " | ".join(
            f"{statistics.median(p):.2f}× ({', '.join(f'{x:.2f}' for x in p)})" if p else "" for p in paired.values()) + " |")
        for name, c in configs.items():
            c["paired_ratios_to_conventional"] = paired[name]
    lines.append("| deployment CPU busy | " + " | ".join(f"{100 * c['median_sut_busy']:.0f}%" for c in configs.values()) + " |")
    lines.append("| rounds' totals (SLA-1/SLA-2) | " + " | ".join(
        ", ".join(f"{r['all']:.2f} ({'P' if r['sla1'] else 'F'}/{'P' if r['sla2'] else 'F'})" for r in c["rounds"])
        for c in configs.values()) + " |")
    if "sprout" in configs and "sprout-shared" in configs:
        iso, shared = configs["sprout"]["median_all"], configs["sprout-shared"]["median_all"]
        lines += ["", f"Network isolation costs Olio on Sprout {iso - shared:+.2f} CPU-ms per operation "
                  f"({100 * (iso - shared) / shared:+.1f}% of the shared-network deployment's)."]
    summary = {"users": users, "configs": configs}
    (out / "equal-load.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "equal-load.md").write_text("\n".join(lines) + "\n")
    plot(configs, out / "equal-load.png")
    print("\n".join(lines))


def plot(configs, path):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = list(configs)
    bottoms = [0.0] * len(names)
    for i, part in enumerate([p for p, _ in PARTS] + ["other"]):
        heights = [configs[n]["median_cpu_ms_per_op"].get(part, 0.0) for n in names]
        if any(heights):
            ax.bar([configs[n]["label"] for n in names], heights, bottom=bottoms, color=COLORS[i % len(COLORS)], label=part)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_ylabel("CPU milliseconds per operation")
    ax.set_title("Olio at equal load: where the CPU goes")
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--cpus", default="0")
    p.add_argument("--agent-cpus", default="1")
    p.add_argument("--port", type=int, default=8095)
    p.add_argument("--accounts-per-user", type=int, default=100)
    p.add_argument("--ramp-up", type=int, default=30)
    p.add_argument("--steady", type=int, default=120)
    p.add_argument("--ramp-down", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--state-root", default="/var/tmp")
    p.add_argument("--out", default=str(REPO / "bench/results/cloudstone/equal-load"))
    p.add_argument("--summarize-only", action="store_true")
    a = p.parse_args()
    out = Path(a.out)
    if not a.summarize_only:
        for k in range(1, a.rounds + 1):
            order = a.configs if k % 2 else list(reversed(a.configs))
            for config in order:
                print(f"==> round {k}/{a.rounds}: {config}", flush=True)
                run_one(config, out / config / f"round-{k}", a)
    summarize(out)


if __name__ == "__main__":
    main()
