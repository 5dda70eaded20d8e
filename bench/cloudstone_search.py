"""Render a Cloudstone search (search.json from `sprout cloudstone search`) as an HTML page:
the search's trace (users tried, SLA-1 and SLA-2 verdicts, throughput, CPU per operation), the maxima, and
dollars per user per month for each price, 1, 12 and 36 months (Cloudstone's Table 1).
With two or more search.json files, `compare` mode writes a side-by-side page and the
summary JSON.

usage: python3 bench/cloudstone_search.py DIR/search.json
       python3 bench/cloudstone_search.py --compare OUT_DIR A/search.json B/search.json [--json bench/results/cloudstone.json]
"""

import argparse
import html
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from cloudstone_breakdown import per_operation  # noqa: E402
from cloudstone_report import existing, interpreter_text, read_json  # noqa: E402

COLORS = {"sprout": "#2a9d8f", "conventional": "#e76f51"}


def money(v):
    return "n/a" if v is None else f"${v:,.4f}" if v < 0.1 else f"${v:,.2f}"


def table(headers, rows):
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


STYLE = """<style>body{font-family:sans-serif;max-width:1300px;margin:2em auto;color:#222}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}img{max-width:100%}
.ok{color:#2a9d8f}.bad{color:#e76f51}</style>"""


def plot_trace(searches, path):
    fig, ax = plt.subplots(figsize=(11, 4))
    for n, s in enumerate(searches):
        color = COLORS.get(s["stack"], "#264653")
        # Later searches draw smaller, so equal points of two searches both show.
        size = 140 / (n + 1)
        for i, step in enumerate(s["trace"]):
            marker = "o" if step["sla2"] else ("s" if step["sla1"] else "x")
            ax.scatter(step["users"], step["ops_per_s"], color=color, marker=marker, s=size, label=s["stack"] if i == 0 else None)
        ax.axvline(s["sla1_users"], color=color, linestyle="--", linewidth=1)
        ax.axvline(s["sla2_users"], color=color, linestyle=":", linewidth=1)
    ax.set_xlabel("concurrent users (o: passes SLA-2, s: SLA-1 only, x: fails; dashed: SLA-1 max, dotted: SLA-2 max)")
    ax.set_ylabel("operations/s in the steady state")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def lower_bound(s, sla):
    """Whether the search's maximum for `sla` is only a lower bound: no run above it failed that
    SLA (the search stopped at --max)."""
    return not any(not st[sla] and st["users"] > s[f"{sla}_users"] for st in s["trace"])


# The ratio a / b when a's maximum, b's, or both are only lower bounds.
RATIO_QUALIFIER = {(False, False): "", (True, False): "at least ", (False, True): "at most ",
                   (True, True): "unknown (both maxima are lower bounds); measured "}


def users_text(s, sla):
    m = s.get(sla) or {}
    spread = f" (to {m['high']}: repeats disagreed)" if m and not m.get("agreed", True) and m.get("high", 0) > s[f"{sla}_users"] else ""
    return ("≥ " if lower_bound(s, sla) else "") + str(s[f"{sla}_users"]) + spread


def cost_rows(s):
    rows = []
    for price in s["prices"]:
        by = s["usd_per_user_month"][price["name"]]
        for sla in ("sla1", "sla2"):
            rows.append([html.escape(price["name"]), sla.upper().replace("SLA", "SLA-"), users_text(s, sla)]
                        + [money(by[sla][m]) for m in ("1", "12", "36")])
    return rows


def report_link(report, out):
    """A run's report path, relative to the search's directory when it lies inside it."""
    return str(Path(report).relative_to(out)) if Path(report).is_relative_to(out) else report


def cpu_per_operation(report):
    """The deployment's CPU milliseconds per operation in a run (from the run.json beside its
    report, or run.json.gz), as text; empty when the run has none. Runs whose figure departs from their
    neighbours' ran on a contended host."""
    for candidate in (Path(report), Path(__file__).resolve().parent.parent / report):
        run = existing(candidate.with_name("run.json"))
        if run:
            parts, _ = per_operation(read_json(run))
            return f"{sum(parts.values()):.2f}"
    return ""


def render_search(path):
    s = json.loads(path.read_text())
    out = path.parent
    plot_trace([s], out / "search_trace.png")
    trace = table(
        ["users", "accounts", "SLA-1", "SLA-2", "ops/s", "CPU-ms per operation", "first failed check", "report"],
        [[st["users"], f"{st['registered_users']:,}", verdict(st["sla1"]), verdict(st["sla2"]), f"{st['ops_per_s']:.1f}",
          cpu_per_operation(st["report"]), html.escape(st["reason"]),
          f"<a href=\"{html.escape(report_link(st['report'], out))}\">run</a>"] for st in s["trace"]],
    )
    prices = "".join(f"<li><b>{html.escape(p['name'])}</b>: {html.escape(p['description'])}</li>" for p in s["prices"])
    bound_note = " (≥: no run above it failed; the search stopped at its --max)" if lower_bound(s, "sla1") or lower_bound(s, "sla2") else ""
    cost_table = table(["price", "SLA", "users", "1 month", "12 months", "36 months"], cost_rows(s))
    page = f"""<!DOCTYPE html><html><head><meta charset="utf-8">\
<title>Cloudstone search: {html.escape(s['stack'])}</title>{STYLE}</head><body>
<h1>Cloudstone search: Olio on {html.escape(s['stack'])}</h1>
<p>Most concurrent users within the SLA: <b>{users_text(s, 'sla1')}</b> at SLA-1 (90th percentile), \
<b>{users_text(s, 'sla2')}</b> at SLA-2 (99th percentile){bound_note};
{s['run_seconds']:.0f} s steady state per run; \
deployment confined to CPUs {html.escape(s['cpus'])}, counted as {s['instances']:g} instance(s);
{html.escape(s['machine'])}. Extra deployment flags: {html.escape(' '.join(s['up_args']) or 'none')}.
Each end of each final bracket ran {s.get('repeats', 1)} time(s); a maximum is taken when they agree, else shown with its spread.</p>
<p>Interpreter: {html.escape(interpreter_text(s.get('interpreter')))}</p>
<h2>Dollars per user per month (Cloudstone Table 1)</h2>{cost_table}<ul>{prices}</ul>
<h2>The search</h2><img src="search_trace.png">{trace}</body></html>"""
    (out / "search.html").write_text(page)
    print(f"wrote {out / 'search.html'}")


def verdict(ok):
    return "<b class=ok>pass</b>" if ok else "<b class=bad>fail</b>"


def compare(out_dir, paths, json_out):
    searches = [json.loads(Path(p).read_text()) for p in paths]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_trace(searches, out_dir / "compare_trace.png")
    default = searches[0]["default_price"]
    rows, md = [], ["| stack | SLA-1 users | SLA-2 users | $/user/month SLA-1 | $/user/month SLA-2 |", "|---|---:|---:|---:|---:|"]
    for s in searches:
        c = s["usd_per_user_month"][default]
        rows.append([html.escape(s["stack"]), users_text(s, "sla1"), users_text(s, "sla2"), money(c["sla1"]["1"]), money(c["sla2"]["1"])])
        md.append(f"| {s['stack']} | {users_text(s, 'sla1')} | {users_text(s, 'sla2')} | "
                  f"{money(c['sla1']['1'])} | {money(c['sla2']['1'])} |")
    interpreters = [f"{s['stack']}'s interpreter: {interpreter_text(s.get('interpreter'))}" for s in searches]
    if len(searches) == 2:
        a, b = searches
        for sla in ("sla1", "sla2"):
            ratio = a[f"{sla}_users"] / b[f"{sla}_users"] if b[f"{sla}_users"] else float("inf")
            qualifier = RATIO_QUALIFIER[lower_bound(a, sla), lower_bound(b, sla)]
            md.append(f"\n{a['stack']} ÷ {b['stack']}, users per dollar at {sla.upper().replace('SLA', 'SLA-')}: "
                      f"**{qualifier}{ratio:.2f}×**")
    terms = ["", "| price | stack | SLA | users | $/user/month over 1 month | over 12 | over 36 |", "|---|---|---|---:|---:|---:|---:|"]
    for price in searches[0]["prices"]:
        for s in searches:
            by = s["usd_per_user_month"].get(price["name"], {})
            for sla in ("sla1", "sla2"):
                c = by.get(sla, {})
                terms.append(f"| {price['name']} | {s['stack']} | {sla.upper().replace('SLA', 'SLA-')} | {users_text(s, sla)} | "
                             + " | ".join(money(c.get(m)) for m in ("1", "12", "36")) + " |")
    term_rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in terms[3:]]
    page = f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>Cloudstone comparison</title>{STYLE}</head><body>
<h1>Cloudstone: {' against '.join(html.escape(s['stack']) for s in searches)}</h1>
{table(['stack', 'SLA-1 users', 'SLA-2 users', f'$/user/month SLA-1 ({default})', f'$/user/month SLA-2 ({default})'], rows)}
<p>{'<br>'.join(html.escape(line.strip()) for line in md[2 + len(searches):])}</p>
<p>{'<br>'.join(html.escape(i) for i in interpreters)}</p>
{table(['price', 'stack', 'SLA', 'users', '$/user/month, 1 month', '12 months', '36 months'], term_rows)}
<img src="compare_trace.png"></body></html>"""
    md += terms + [""] + [f"- {i}" for i in interpreters]
    (out_dir / "compare.html").write_text(page)
    (out_dir / "compare.md").write_text("\n".join(md) + "\n")
    if json_out:
        summary = {
            "machine": searches[0]["machine"],
            "run_seconds": searches[0]["run_seconds"],
            "price": default,
            "stacks": {
                s["stack"]: {
                    "sla1_users": s["sla1_users"],
                    "sla2_users": s["sla2_users"],
                    # True where no run above the maximum failed (the search stopped at --max).
                    "sla1_lower_bound": lower_bound(s, "sla1"),
                    "sla2_lower_bound": lower_bound(s, "sla2"),
                    # Each maximum with the highest users any run passed at, and whether the
                    # repeated runs at its bracket agreed.
                    "sla1_spread": s.get("sla1"),
                    "sla2_spread": s.get("sla2"),
                    "interpreter": s.get("interpreter"),
                    "usd_per_user_month": s["usd_per_user_month"][default],
                    "usd_per_user_month_by_price": s["usd_per_user_month"],
                    "report": str(Path(paths[i]).with_name("search.html")),
                }
                for i, s in enumerate(searches)
            },
        }
        Path(json_out).write_text(json.dumps(summary, indent=2) + "\n")
    print("\n".join(md))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("search", nargs="*")
    p.add_argument("--compare", metavar="OUT_DIR")
    p.add_argument("--json")
    a = p.parse_args()
    if a.compare:
        compare(a.compare, a.search, a.json)
    else:
        for s in a.search:
            render_search(Path(s))


if __name__ == "__main__":
    main()
