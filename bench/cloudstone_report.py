"""Render one Cloudstone run (run.json from `sprout load run`) as an HTML page with plots:
response-time percentiles over time per operation, throughput and active users, and the
utilization of the system under test; tables of per-operation statistics and checks.

usage: python3 bench/cloudstone_report.py RUN_DIR/run.json   (writes RUN_DIR/report.html)
       python3 bench/cloudstone_report.py RUN_DIR/run.json.gz   (a run kept gzipped, as in bench/results)
"""

import gzip
import html
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = ["#264653", "#2a9d8f", "#e9c46a", "#f4a261", "#e76f51", "#6d597a", "#118ab2"]


def read_json(path):
    """A JSON file, read through gzip when its name ends in .gz (bench/results keeps large runs so)."""
    path = Path(path)
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    return json.loads(path.read_text())


def existing(path):
    """`path` if it exists, else its gzipped copy `path`.gz if that does; None if neither does."""
    path = Path(path)
    return next((p for p in (path, path.with_name(path.name + ".gz")) if p.exists()), None)



def interpreter_text(rec):
    """One line for the interpreter build a deployment's Python processes ran (olio_deploy/interpreter.py)."""
    if not rec:
        return "not recorded (run without --deployment)"
    if "error" in rec:
        return f"unknown: {rec['error']}"
    where = rec["executable"] + (f" in {rec['root']}" if rec.get("root") else "") + (f" (venv {rec['venv']})" if rec.get("venv") else "")
    running = ", ".join(f"{n} × {k}" for k, n in rec.get("processes", {}).items()) or "none seen"
    check = "" if rec.get("processes_match") else " — NOT all this build"
    return (f"CPython {rec['version']}, {where}, {rec.get('package') or 'no Debian package'}, libpython "
            f"{'shared' if rec.get('libpython') else 'static'}; build {rec['identity']}; "
            f"Python processes: {running}{check}")

def plot_response_times(run, path):
    names = list(run["operations"])
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.5), sharex=True)
    for ax, pct in zip(axes, ("p90_ms", "p99_ms")):
        for i, name in enumerate(names):
            pts = [(s["t"], s["operations"][name][pct]) for s in run["series"] if s["operations"][name]["count"] > 0]
            if pts:
                ax.plot(*zip(*pts), label=name, color=COLORS[i % len(COLORS)], marker=".")
            limit = run["operations"][name]["max90_s"] * 1000
            ax.axhline(limit, color=COLORS[i % len(COLORS)], linestyle=":", linewidth=0.8)
        ax.set_title(f"{pct[:3]} response time per interval (dotted: each operation's limit)")
        ax.set_xlabel("seconds into the run")
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        shade_steady(ax, run)
    axes[1].legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def shade_steady(ax, run):
    spec = run["spec"]
    ax.axvspan(spec["ramp_up_s"], spec["ramp_up_s"] + spec["steady_s"], color="#2a9d8f", alpha=0.06)


def plot_load(run, path):
    fig, ax = plt.subplots(figsize=(14, 3.8))
    t = [s["t"] for s in run["series"]]
    ax.plot(t, [s["ops_per_s"] for s in run["series"]], color="#264653", label="operations/s")
    errors = [s["errors"] for s in run["series"]]
    if any(errors):
        ax.bar(t, errors, width=(t[1] - t[0]) * 0.8 if len(t) > 1 else 1, color="#e76f51", alpha=0.6,
               label="errors per interval", align="edge")
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("operations/s")
    shade_steady(ax, run)
    ax2 = ax.twinx()
    if run["active_users"]:
        ax2.step(*zip(*run["active_users"]), where="post", color="#f4a261", label="active users")
    ax2.set_ylabel("active users")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", fontsize=8)
    ax.set_title("throughput and users (shaded: steady state)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_utilization(run, path):
    u = run["utilization"]
    if not u:
        return False
    t = [s["t"] for s in u]
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    ncpu = len(u[0]["cpu_busy"])
    for c in range(ncpu):
        label = f"CPU {c}" + (" (system under test)" if c in run["sut_cpus"] else "")
        axes[0].plot(t, [s["cpu_busy"][c] * 100 for s in u], label=label, color=COLORS[c % len(COLORS)])
    axes[0].set_title("CPU busy (mpstat)")
    axes[0].set_ylabel("%")
    axes[0].set_ylim(0, 105)
    axes[0].legend(fontsize=8)
    axes[1].plot(t, [s["mem_used_bytes"] / 2**30 for s in u], label="machine in use", color="#264653")
    if any(s.get("sut_pss_bytes") is not None for s in u):
        axes[1].plot(t, [(s.get("sut_pss_bytes") or 0) / 2**30 for s in u], label="deployment PSS", color="#e76f51")
    axes[1].set_title("memory (vmstat; PSS of the deployment)")
    axes[1].set_ylabel("GiB")
    axes[1].legend(fontsize=8)
    axes[2].plot(t, [s["net_rx_bytes_per_s"] / 2**20 for s in u], label="network in (netstat)", color="#2a9d8f")
    axes[2].plot(t, [(s["disk_read_bytes_per_s"] + s["disk_write_bytes_per_s"]) / 2**20 for s in u],
                 label="disk read+write (iostat)", color="#f4a261")
    axes[2].set_title("I/O")
    axes[2].set_ylabel("MiB/s")
    axes[2].legend(fontsize=8)
    for ax in axes:
        ax.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def table(headers, rows):
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render(run, out_dir):
    plot_response_times(run, out_dir / "response_times.png")
    plot_load(run, out_dir / "load.png")
    has_util = plot_utilization(run, out_dir / "utilization.png")
    ops = table(
        ["operation", "count", "errors", "mean ms", "p90 ms", "p99 ms", "max ms", "limit s", "share", "target share"],
        [
            [
                html.escape(name), o["count"], o["errors"] or "", f"{o['mean_ms']:.1f}", f"{o['p90_ms']:.1f}", f"{o['p99_ms']:.1f}",
                f"{o['max_ms']:.1f}", o["max90_s"], f"{o['share_pct']:.2f}%", f"{o['target_pct']:.2f}%",
            ]
            for name, o in run["operations"].items()
        ],
    )
    checks = table(
        ["check", "verdict", "detail"],
        [[html.escape(c["name"]), "<b class=ok>PASS</b>" if c["passed"] else "<b class=bad>FAIL</b>", html.escape(c["detail"])]
         for c in run["checks"]],
    )
    errors = {k: v for o in run["operations"].values() for k, v in o["errors_by_kind"].items()}
    spec = run["spec"]
    settings = table(
        ["setting", "value"],
        [
            ["stack", html.escape(run["stack"])], ["site", html.escape(run["url"])], ["concurrent users (peak)", run["peak_users"]],
            ["user accounts", f"{run['registered_users']:,} (U = {run['u']:.2f})"],
            ["ramp-up / steady / ramp-down s", f"{spec['ramp_up_s']:.0f} / {spec['steady_s']:.0f} / {spec['ramp_down_s']:.0f}"],
            ["SLA window s", f"{spec['window_s']:.0f}"], ["agents", spec["agents"]],
            ["load profile", html.escape(str(spec.get("profile") or "constant"))],
            ["operations/s (steady)", f"{run['ops_per_s']:.2f}"], ["mean cycle time", f"{run['mean_cycle_ms']:.0f} ms"],
            ["counters", html.escape(json.dumps(run["counters"]))], ["errors by kind", html.escape(json.dumps(errors)) or "none"],
            ["system under test CPUs", run["sut_cpus"]], ["machine", html.escape(run["machine"])],
            ["interpreter", html.escape(interpreter_text(run.get("interpreter")))],
        ],
    )
    res = run.get("resources") or {}
    resources = ""
    if res:
        gb = res.get("gb_seconds")
        rows = [["seconds sampled", f"{res['seconds']:.0f}"], ["CPU-seconds on the system's CPUs", f"{res['cpu_seconds']:.1f}"],
                ["memory GB-seconds (deployment PSS)", "not known" if gb is None else f"{gb:.1f}"]]
        for name, c in res.get("costs", {}).items():
            used = "n/a" if c["used_usd"] is None else f"${c['used_usd']:.6f}"
            rows.append([f"{html.escape(name)}: billed per second for what was used / {res['instances']:g} instance(s) always on",
                         f"{used} / ${c['provisioned_usd']:.6f}"])
        resources = "<h2>Resources used and their cost</h2>" + table(["", "value"], rows)
        by_process = res.get("cpu_seconds_by_process") or {}
        if by_process:
            total = sum(by_process.values()) or 1.0
            ranked = sorted(by_process.items(), key=lambda kv: -kv[1])
            resources += "<h3>Where the deployment's CPU time went (its processes, by kind)</h3>" + table(
                ["process", "CPU-seconds", "share"], [[html.escape(k), f"{v:.1f}", f"{100 * v / total:.1f}%"] for k, v in ranked])
    verdict = lambda ok: "<b class=ok>PASS</b>" if ok else "<b class=bad>FAIL</b>"  # noqa: E731
    page = f"""<!DOCTYPE html><html><head><meta charset="utf-8">\
<title>Cloudstone run: {html.escape(run['stack'])}, {run['peak_users']} users</title>
<style>body{{font-family:sans-serif;max-width:1400px;margin:2em auto;color:#222}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}td:first-child,th:first-child{{text-align:left}}\
.ok{{color:#2a9d8f}}.bad{{color:#e76f51}}img{{max-width:100%}}</style></head>
<body><h1>Cloudstone run: {html.escape(run['workload'])} on {html.escape(run['stack'])}, {run['peak_users']} users</h1>
<p>SLA-1 (90th percentile): {verdict(run['sla1_passed'])} &nbsp; SLA-2 (99th percentile): {verdict(run['sla2_passed'])}</p>
<h2>Operations (steady state)</h2>{ops}<h2>Checks</h2>{checks}
<h2>Response times</h2><img src="response_times.png"><h2>Throughput and users</h2><img src="load.png">
{'<h2>Utilization of the system under test</h2><img src="utilization.png">' if has_util else ''}
{resources}<h2>Settings</h2>{settings}</body></html>"""
    (out_dir / "report.html").write_text(page)


def main(path):
    path = Path(path)
    render(read_json(path), path.parent)
    print(f"wrote {path.parent / 'report.html'}")


if __name__ == "__main__":
    main(sys.argv[1])
