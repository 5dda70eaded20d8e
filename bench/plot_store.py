"""Plot bench/results/store.json (Mirage figure 3): writes per second by record size for each
system, and sprout.store's ratios to its peers.

usage: python3 bench/plot_store.py store.json store.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "sprout-sqlite": ("#2a9d8f", "o-", 2.5), "sqlite3-tuned": ("#264653", "s--", 1.5),
    "sqlite3-default": ("#e76f51", "v--", 1.5), "sqlalchemy": ("#e9c46a", "^-", 1.5),
    "peewee": ("#f4a261", "d-", 1.5), "sprout-postgres": ("#8ab17d", "o-", 2),
}


def main(src, dst):
    r = json.load(open(src))
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.2))
    for system, values in r["systems"].items():
        sizes = sorted(int(s) for s in values)
        color, style, width = STYLE.get(system, (None, "o-", 1.5))
        left.plot(sizes, [values[str(s)] for s in sizes], style, color=color, lw=width, label=system)
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("record size (bytes)")
    left.set_ylabel("writes per second (log)")
    left.set_title("insert / update / delete, checked each iteration (Mirage fig. 3)")
    left.legend(fontsize=8)
    labels = {"sprout_over_sqlalchemy": "× SQLAlchemy ORM", "sprout_over_peewee": "× Peewee",
              "sprout_over_sqlite3_default": "× stock sqlite3 (defaults)",
              "sqlite3_tuned_over_sprout": "hand-written sqlite3 (same settings) ÷ sprout"}
    for key, label in labels.items():
        values = r["ratios"].get(key, {})
        sizes = sorted(int(s) for s, v in values.items() if v)
        right.plot(sizes, [values[str(s)] for s in sizes], "o-", label=label)
    right.axhline(1.0, color="grey", lw=0.8)
    right.axhline(2.0, color="#e9c46a", lw=0.8, ls=":")
    right.axhline(1.3, color="#264653", lw=0.8, ls=":")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("record size (bytes)")
    right.set_ylabel("ratio (log)")
    right.set_title("sprout.store (SQLite) against its peers")
    right.legend(fontsize=8)
    fig.suptitle(f"sprout.store — {r['machine']}; {r['method']['pinning']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
