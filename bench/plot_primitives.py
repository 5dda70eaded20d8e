#!/usr/bin/env python3
"""Plot `sprout bench primitives` (SOCK section 2, figures 1-5 on this kernel).

Usage: plot_primitives.py RESULTS.json OUT.png

A 2x2 figure: storage (bind vs overlay mount+unmount), mount-namespace churn against the
number of existing mounts, namespace create+teardown per flag set, and cgroup create vs reuse.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def by_concurrency(series):
    """{"c1": r, "c8": r} -> ([1, 8], [r, r]) sorted by concurrency."""
    points = sorted((int(k[1:]), v) for k, v in series.items() if k.startswith("c") and v is not None)
    return [c for c, _ in points], [v for _, v in points]


def headroom(ax, top=1.0, bottom=1.0):
    """Stretch a log-scale y axis by these factors, to leave room for the legend."""
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo / bottom, hi * top)


def concurrency_axis(ax, xs):
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel("concurrency (threads)")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_primitives.py RESULTS.json OUT.png")
    with open(sys.argv[1]) as f:
        data = json.load(f)

    fig, axes = plt.subplots(2, 2, figsize=(13, 9.5))
    all_conc = sorted(set(data.get("concurrency") or [1]))

    # Figure 1: storage.
    ax = axes[0][0]
    storage = data.get("storage", {})
    fs = storage.get("work_dir_fs", "?")
    for name, style, label in (
        ("bind", "o-", "bind"),
        ("overlay", "s--", f"overlay, writable upper on {fs} (for AUFS)"),
        ("overlay_ro", "^:", "overlay, 2 read-only layers"),
    ):
        xs, ys = by_concurrency(storage.get(name, {}))
        if xs:
            ax.plot(xs, ys, style, label=label)
    concurrency_axis(ax, all_conc)
    ax.set_yscale("log")
    headroom(ax, top=6)
    ax.set_ylabel("mount + unmount / s")
    ax.set_title("Fig. 1: storage primitives")
    ax.legend(loc="upper left", fontsize=9)

    # Figure 2: mount namespace churn vs existing mounts.
    ax = axes[0][1]
    mns = data.get("mount_ns", {})
    mounts = mns.get("mounts", [])
    keys = sorted((k for k in mns if k.startswith("c") and isinstance(mns[k], list)), key=lambda k: int(k[1:]))
    for k, style in zip(keys, ("o-", "s--", "^-.", "d:")):
        ys = mns[k]
        ax.plot(mounts[: len(ys)], ys, style, label=f"concurrency {k[1:]}")
    if mounts:
        ax.set_xscale("symlog", linthresh=max(1, min([m for m in mounts if m > 0] or [100])))
        ax.set_xticks(mounts)
        ax.set_xticklabels([str(m) for m in mounts])
    ax.set_yscale("log")
    base = mns.get("base_mounts")
    ax.set_xlabel("extra mounts in the namespace" + (f" (plus {base} present)" if base else ""))
    ax.set_ylabel("unshare(CLONE_NEWNS) + exit / s")
    ax.set_title("Fig. 2: mount-namespace scalability")
    ax.legend()

    # Figures 3-4: namespaces.
    ax = axes[1][0]
    ns = data.get("namespaces", {})
    labels = {
        "none": "fork only",
        "sock": "sock (pid+ipc+uts)",
        "no_net": "pid+ipc+uts+mnt",
        "all": "all five",
    }
    markers = "ovs^<>Dpx*"
    for i, (name, series) in enumerate(ns.items()):
        xs, ys = by_concurrency(series)
        if not xs:
            continue
        bold = name in ("none", "sock", "all")
        ax.plot(
            xs,
            ys,
            marker=markers[i % len(markers)],
            linestyle="-" if bold else "--",
            linewidth=2.2 if bold else 1.2,
            label=labels.get(name, name),
        )
    concurrency_axis(ax, all_conc)
    ax.set_yscale("log")
    headroom(ax, bottom=5)
    ax.set_ylabel("fork + unshare + exit + reap / s")
    ax.set_title("Figs. 3-4: namespace create + teardown")
    ax.legend(loc="lower center", fontsize=8, ncol=3)

    # Figure 5: cgroups.
    ax = axes[1][1]
    cg = data.get("cgroups", {})
    for name, style, label in (
        ("reuse", "o-", "reuse (join a pooled cgroup)"),
        ("create", "s--", "create + join + remove"),
    ):
        xs, ys = by_concurrency(cg.get(name, {}))
        if xs:
            ax.plot(xs, ys, style, label=label)
    concurrency_axis(ax, all_conc)
    ax.set_ylabel("child processes / s")
    ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.25)
    ax.set_title("Fig. 5: cgroup primitives")
    ax.legend(loc="upper center", ncol=2, fontsize=9)

    for row in axes:
        for ax in row:
            ax.grid(True, which="both", alpha=0.3)

    r = data.get("ratios", {})

    def fmt(k):
        v = r.get(k)
        return "–" if v is None else f"{v:.2f}×"

    fig.suptitle(
        "Linux primitives (SOCK §2) — " + data.get("machine", "") + "\n"
        f"at max concurrency: bind/overlay {fmt('bind_over_overlay')}, "
        f"cgroup reuse/create {fmt('reuse_over_create')}, sock/all {fmt('sock_over_all')}, "
        f"no-net/all {fmt('no_net_over_net')}",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
