"""Plot and tabulate `sprout cloudstone fleet`'s summary: the sites each deployment held within
SLA-2 and the memory budget, and, at each one's largest passing fleet, its memory and CPU over
the run. Writes fleet.png and fleet.md beside the summary.

usage: python3 bench/plot_fleet.py bench/results/fleet.json
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from cloudstone_report import existing, read_json  # noqa: E402

ORDER = ["sprout", "sprout-runc", "sprout-gvisor", "conventional-ondemand", "conventional"]
COLORS = {"sprout": "#2a9d8f", "sprout-runc": "#e9c46a", "sprout-gvisor": "#6d597a", "conventional-ondemand": "#e76f51",
          "conventional": "#8d99ae"}


def cpus(text):
    out = []
    for part in str(text).split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def best_run(summary, runs_dir, name):
    """The fleet-run.json (or fleet-run.json.gz) of the stack's largest passing fleet (or its smallest run)."""
    steps = summary["stacks"][name]["steps"]
    passed = [s for s in steps if s["passed"] and s.get("run")]
    pick = max(passed, key=lambda s: s["sites"]) if passed else min((s for s in steps if s.get("run")),
                                                                      key=lambda s: s["sites"], default=None)
    if pick is None:
        return None, None
    path = existing(runs_dir / pick["run"])
    return pick, (read_json(path) if path else None)


def table(summary):
    budget = summary["memory_budget_mb"]
    lines = [f"Cloudstone for a fleet: the most Olio sites within SLA-2 in {budget} MiB on CPU(s) "
             f"{summary['sut_cpus']} (load on CPU(s) {','.join(map(str, summary['agent_cpus']))}), "
             f"{summary['span_s']:.0f} s runs.", "",
             "| deployment | sites at SLA-2 | first request after idle, p99 ms | MiB per site: at rest, at peak | "
             "a resident site's processes: private (PSS) MiB | a database connection: private (PSS) MiB | "
             "$ per site-month (each price in bench/pricing.toml) | runs (sites: result) |",
             "|---|---|---|---|---|---|---|---|"]
    for name in ORDER:
        s = summary["stacks"].get(name)
        if not s:
            continue
        runs = "; ".join(f"{st['sites']}: {'held' if st['passed'] else 'failed (' + st['reason'][:80] + ')'}"
                         for st in s["steps"])
        usd = ", ".join(f"{k} ${v:.3f}" for k, v in s.get("usd_per_site_month_by_price", {}).items()) or "-"
        held = f"{s['sites_sla2']}{'+' if s.get('lower_bound') else ''}"
        per_site, processes, connection = memory_columns(s)
        first = s.get("first_after_idle_p99_ms")
        first = f"{first:.0f}" if isinstance(first, (int, float)) else "-"
        parked = s.get("first_request_after_park_p99_ms")
        if isinstance(parked, (int, float)):
            first += f" (after a park, in the worker: {parked:.0f})"
        lines.append(f"| {name} | {held} | {first} | {per_site} | {processes} | {connection} | {usd} | {runs} |")
    searched = [f"{name} on {s['date']} ({s.get('machine', summary.get('machine'))})" for name in ORDER
                if (s := summary["stacks"].get(name)) and s.get("date")
                and (s["date"], s.get("machine")) != (summary.get("date"), summary.get("machine"))]
    if searched:
        lines.append("")
        lines.append(f"Searched on {summary.get('date')} ({summary.get('machine')}) but for: " + "; ".join(searched)
                     + ". Ratios between deployments searched on different days or hosts are not a same-run comparison.")
    ratios = summary.get("ratios", {})
    cut = [n for n in ORDER if summary["stacks"].get(n, {}).get("lower_bound")]
    lines.append("")
    lines.append("Ratios: sprout / conventional " + fmt(ratios.get("sprout_vs_conventional"))
                 + ", sprout / conventional-ondemand " + fmt(ratios.get("sprout_vs_conventional_ondemand"))
                 + ", sprout / sprout-runc " + fmt(ratios.get("sprout_vs_sprout_runc"))
                 + ", sprout / sprout-gvisor " + fmt(ratios.get("sprout_vs_sprout_gvisor"))
                 + ", sprout-gvisor / conventional-ondemand " + fmt(ratios.get("sprout_gvisor_vs_conventional_ondemand")) + "."
                 + (f" A + marks a search that stopped while its last run held ({', '.join(cut)}): a lower bound, "
                    "so a ratio against it is an upper bound." if cut else ""))
    return "\n".join(lines) + "\n"


def memory_columns(stack):
    """At the largest passing run (else the smallest run): the deployment's PSS per site at rest
    after the load and at its peak, and the median site's processes and database connection."""
    steps = stack["steps"]
    passed = [s for s in steps if s["passed"]]
    step = max(passed, key=lambda s: s["sites"]) if passed else min(steps, key=lambda s: s["sites"], default=None)
    if step is None:
        return "-", "-", "-"
    n = step["sites"]
    rest, peak = step.get("rest_mb"), step.get("peak_mb")
    per_site = f"{rest / n:.1f}, {peak / n:.1f} ({n} sites)" if rest and peak else "-"

    def unit(kind):
        m = (step.get("sites_at_rest") or {}).get(kind) or {}
        return f"{m['private_mb']:.1f} ({m['pss_mb']:.1f}), {m['count']} at rest" if m.get("count") else "-"

    return per_site, unit("site_processes"), unit("db_connections")


def fmt(x):
    return f"{x:.1f}x" if isinstance(x, (int, float)) else "-"


def main(src):
    src = Path(src)
    summary = json.loads(src.read_text())
    runs_dir = src.parent / summary["runs_dir"]  # relative to the summary, or absolute
    names = [n for n in ORDER if n in summary["stacks"]]
    sut = cpus(summary["sut_cpus"])
    fig, (bars, mem, cpu) = plt.subplots(1, 3, figsize=(16, 4.8))
    held = [summary["stacks"][n]["sites_sla2"] for n in names]
    drawn = bars.bar(names, held, color=[COLORS[n] for n in names])
    for bar, n in zip(drawn, names):
        stack = summary["stacks"][n]
        usd = stack.get("usd_per_site_month")
        # A search that stopped while its last run held is a lower bound (+), its price an upper one.
        label = f"{bar.get_height():.0f}{'+' if stack.get('lower_bound') else ''}" + (
            f"\n${usd:.3f}/site-month ({summary['price']['name']})" if usd else "")
        bars.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    bars.set_xticks(range(len(names)), [n.replace("-", "-\n") for n in names])  # long names side by side
    bars.set_ylim(0, max(held + [1]) * 1.18)  # room for the labels above the tallest bar
    bars.set_ylabel("sites within SLA-2 and the memory budget")
    bars.set_title(f"Sites held in {summary['memory_budget_mb']} MiB")
    for n in names:
        step, run = best_run(summary, runs_dir, n)
        if not run:
            continue
        samples = run.get("utilization", [])
        t = [s["t"] for s in samples]
        pss = [(s.get("sut_pss_bytes") or 0) / 2**20 for s in samples]
        busy = [sum(s["cpu_busy"][c] for c in sut if c < len(s["cpu_busy"])) for s in samples]
        label = f"{n}, {step['sites']} sites ({'held' if step['passed'] else 'failed'})"
        mem.plot(t, pss, color=COLORS[n], label=label)
        cpu.plot(t, busy, color=COLORS[n], label=label, linewidth=1)
    mem.axhline(summary["memory_budget_mb"], color="#c1121f", linestyle=":", linewidth=1, label="budget")
    mem.set_xlabel("seconds")
    mem.set_ylabel("PSS of the deployment's processes, MiB")
    mem.set_title("Memory over the run")
    mem.legend(fontsize=7)
    cpu.set_xlabel("seconds")
    cpu.set_ylabel("busy CPUs of the deployment")
    cpu.set_title("CPU over the run")
    cpu.legend(fontsize=7)
    for ax in (bars, mem, cpu):
        ax.grid(True, alpha=0.3)
    fig.suptitle(summary.get("machine", ""), fontsize=8)
    fig.tight_layout()
    fig.savefig(src.with_suffix(".png"), dpi=130)
    src.with_suffix(".md").write_text(table(summary))


if __name__ == "__main__":
    main(sys.argv[1])
