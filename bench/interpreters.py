"""The interpreter effect on its own: Olio's request path, in-process, on every CPython the
project can meet (the sandbox base's, the conventional deployment's virtual environment's,
and any other 3.11 on the machine, such as a from-source build first on PATH).

Each interpreter runs the same child: Olio's Flask app (olio.wsgi) over a SQLite database the
loader filled once, its test client asking for the home page (a template of ten events) and an
event's page, on one pinned CPU, with the very same site-packages (the venv's, on PYTHONPATH;
3.11 wheels fit every 3.11 build). The sandbox base's interpreter runs chrooted into the base,
as in a sandbox. Interpreters take turns, round after round, so drift on a shared host hits
all alike. Writes bench/results/interpreters.{json,md,png}.

usage: python3 bench/interpreters.py [--rounds 5] [--requests 300] [--cpu 1]
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "python"), str(REPO / "apps" / "olio")]
from olio_deploy import conventional, interpreter, sprout_stack  # noqa: E402

PATHS = ("/", "/events/{event}")

CHILD = r'''
import json, os, re, sys, time
cpu, requests, batches = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
os.sched_setaffinity(0, {cpu})
from olio.wsgi import app
client = app.test_client()
home = client.get("/")
assert home.status_code == 200, home.status_code
event = re.findall(r'href="/events/(\d+)"', home.get_data(as_text=True))[0]
out = {"executable": os.path.realpath(sys.executable), "version": sys.version.split()[0], "ms": {}}
for template in PATHS:
    path = template.format(event=event)
    for _ in range(requests // 3):  # warm: caches, the specializing interpreter
        assert client.get(path).status_code == 200
    means = []
    for _ in range(batches):
        t = time.perf_counter()
        for _ in range(requests):
            client.get(path)
        means.append((time.perf_counter() - t) / requests * 1e3)
    out["ms"][template] = means
print(json.dumps(out))
'''


def candidates(venv):
    """(name, argv prefix, how it is described) for each distinct interpreter found."""
    found = [("sandbox base (chroot)", "base", interpreter.describe("/usr/bin/python3", root=sprout_stack.SANDBOX_BASE)),
             ("conventional venv", str(venv / "bin" / "python"), interpreter.describe(str(venv / "bin" / "python")))]
    others = {shutil.which("python3") or "", "/usr/bin/python3", *glob.glob("/usr/local/bin/python3.11"),
              *glob.glob(os.path.expanduser("~/.pyenv/versions/3.11*/bin/python3.11"))}
    seen = {found[1][2]["executable"]}
    for path in sorted(p for p in others if p and os.path.exists(p)):
        info = interpreter.describe(path)
        if info["executable"] in seen or not info["version"].startswith("3.11"):
            continue
        seen.add(info["executable"])
        found.append((f"{'PATH python3' if path == shutil.which('python3') else path}", path, info))
    return found


def run_child(how, work, site, cpu, requests, batches):
    env = {"PATH": "/usr/bin:/bin", "OLIO_DB": "sqlite://{work}/olio.db", "OLIO_FILES": "{work}/files",
           "OLIO_SECRET": "interpreter-bench", "OLIO_CACHE": "", "PYTHONDONTWRITEBYTECODE": "1"}
    args = [str(cpu), str(requests), str(batches)]
    if how == "base":
        base = sprout_stack.SANDBOX_BASE
        binds = {"site": site, "python": REPO / "python", "olio": REPO / "apps" / "olio", "work": work}
        script = ["set -e", f"mount -t tmpfs tmpfs {base}/mnt"]
        for name, src in binds.items():
            script += [f"mkdir {base}/mnt/{name}", f"mount --bind {src} {base}/mnt/{name}"]
        inner = {k: v.format(work="/mnt/work") for k, v in env.items()}
        inner["PYTHONPATH"] = "/mnt/python:/mnt/olio:/mnt/site"
        script.append("exec chroot " + base + " /usr/bin/env -i " + " ".join(f"{k}={v}" for k, v in inner.items())
                      + " /usr/bin/python3 /mnt/work/child.py " + " ".join(args))
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", "\n".join(script)]
        child_env = None
    else:
        argv = [how, f"{work}/child.py", *args]
        child_env = {k: v.format(work=work) for k, v in env.items()}
        child_env["PYTHONPATH"] = f"{REPO / 'python'}:{REPO / 'apps' / 'olio'}:{site}"
    out = subprocess.run(argv, env=child_env, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise SystemExit(f"{how}: the child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=300, help="requests per batch")
    p.add_argument("--batches", type=int, default=3, help="batches per path and child")
    p.add_argument("--cpu", type=int, default=1, help="the CPU every child is pinned to")
    p.add_argument("--users", type=int, default=1000, help="the loader's scale")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    a = p.parse_args()

    class Dep:  # what conventional.ensure_venv needs of a deployment
        app_dir = REPO / "apps" / "olio"
        log = staticmethod(print)

    venv = conventional.ensure_venv(Dep)
    site = next((venv / "lib").glob("python3*/site-packages"))
    work = Path(tempfile.mkdtemp(prefix="sprout-interpreters-"))
    os.chmod(work, 0o755)
    try:
        (work / "child.py").write_text(f"PATHS = {PATHS!r}\n" + CHILD)
        print(f"==> loading Olio into SQLite ({a.users} users) in {work}", flush=True)
        env = dict(os.environ, PYTHONPATH=f"{REPO / 'python'}:{REPO / 'apps' / 'olio'}")
        subprocess.run([str(venv / "bin" / "python"), "-m", "olio.loader", "--users", str(a.users), "--seed", "1",
                        "--db", f"sqlite://{work}/olio.db", "--files", str(work / "files")], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        found = candidates(venv)
        for name, _, info in found:
            print(f"    {name}: {interpreter.summary(interpreter.report(info, []))}", flush=True)
        ms = {name: {t: [] for t in PATHS} for name, _, _ in found}
        for r in range(a.rounds):
            order = found[r % len(found):] + found[:r % len(found)]
            for name, how, _ in order:
                got = run_child(how, work, site, a.cpu, a.requests, a.batches)
                for t in PATHS:
                    ms[name][t] += got["ms"][t]
            print(f"==> round {r + 1}/{a.rounds}: " + "; ".join(
                f"{n} {statistics.median(ms[n]['/']):.3f} ms" for n, _, _ in found), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write(a, found, ms)


def write(a, found, ms):
    reference = found[0][0]
    rows = []
    for name, _, info in found:
        row = {"interpreter": name, "identity": info["identity"], "summary": interpreter.summary(interpreter.report(info, [])),
               "same_build_as_sandbox_base": info["identity"] == found[0][2]["identity"], "paths": {}}
        for t in PATHS:
            values = ms[name][t]
            med = statistics.median(values)
            row["paths"][t] = {"median_ms": med, "min_ms": min(values), "max_ms": max(values), "batches": len(values),
                               "ratio_to_sandbox_base": med / statistics.median(ms[reference][t])}
        rows.append(row)
    result = {"benchmark": "olio request path in-process per interpreter", "date": time.strftime("%Y-%m-%d"),
              "machine": machine(), "cpu": a.cpu, "rounds": a.rounds, "requests_per_batch": a.requests,
              "method": "Flask test client, SQLite loaded at --users, same site-packages for all; interpreters alternate each round",
              "interpreters": rows}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "interpreters.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [f"Olio's request path in-process (Flask test client, SQLite, {a.requests} requests per batch, "
          f"{a.rounds} rounds, pinned to CPU {a.cpu}); `python3 bench/interpreters.py`, {result['date']}, {result['machine']}.",
          "", "| interpreter | build | home page ms (median) | ÷ sandbox base | event page ms | ÷ sandbox base |",
          "|---|---|---:|---:|---:|---:|"]
    for row in rows:
        h, e = row["paths"]["/"], row["paths"]["/events/{event}"]
        md.append(f"| {row['interpreter']} | {row['summary']} | {h['median_ms']:.3f} ({h['min_ms']:.3f}-{h['max_ms']:.3f}) | "
                  f"{h['ratio_to_sandbox_base']:.2f}× | {e['median_ms']:.3f} | {e['ratio_to_sandbox_base']:.2f}× |")
    (out / "interpreters.md").write_text("\n".join(md) + "\n")
    fig, ax = plt.subplots(figsize=(9, 3.5))
    names = [r["interpreter"] for r in rows]
    for i, t in enumerate(PATHS):
        data = [ms[n][t] for n in names]
        ax.boxplot(data, positions=[j * 3 + i for j in range(len(names))], widths=0.8, patch_artist=True,
                   boxprops={"facecolor": ("#2a9d8f", "#e9c46a")[i]})
    ax.set_xticks([j * 3 + 0.5 for j in range(len(names))], names)
    ax.set_ylabel("ms per request (batch means)")
    ax.set_title("Olio in-process: home page (green), event page (yellow)")
    fig.tight_layout()
    fig.savefig(out / "interpreters.png", dpi=110)
    print("\n".join(md))


def machine():
    try:
        model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
        return f"{os.cpu_count()} cores ({model}), Linux {os.uname().release}"
    except OSError:
        return "unknown"


if __name__ == "__main__":
    main()
