"""Mirage's storage benchmark (figure 3) for sprout.store and its peers, side by side in one run.

For each record size (64 B, 1 KiB, 4 KiB, 16 KiB, 64 KiB) and each system, ITERATIONS times:
insert a record with a random payload, update a random live record with a new payload, and
delete the oldest live record once ten are live; then read back every live record and check
the database holds exactly the expected values (a mismatch stops the run). Every write is its
own transaction, as an application saving one record would commit it. Reported: writes
(inserts + updates + deletes) per second, the checks included in the time, the median of
REPEATS runs of each point, the systems' runs interleaved so that the host's noise falls on
all of them alike.

Systems:
  sprout-sqlite     sprout.store on its tuned SQLite (WAL, synchronous NORMAL, 4 KiB pages,
                    256 MiB mmap, 64 MiB cache)
  sqlite3-default   hand-written sqlite3 with SQLite's and Python's defaults (rollback
                    journal, synchronous FULL, a commit after each write): the stock baseline
  sqlite3-tuned     hand-written sqlite3 on the same settings as sprout-sqlite (autocommit)
  sqlalchemy        SQLAlchemy 2 ORM, a session committing each write, on the same settings
  peewee            Peewee, each write committed, on the same settings
  sprout-postgres   sprout.store on a local PostgreSQL server (fsync on)

usage: store_bench.py OUT_DIR [--iterations N] [--sizes 64,1024,...] [--systems a,b]
                              [--server-cpu C] [--client-cpu C]
"""

import argparse
import json
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import sprout.store as store  # noqa: E402

SIZES = [64, 1024, 4096, 16384, 65536]
SYSTEMS = ["sprout-sqlite", "sqlite3-default", "sqlite3-tuned", "sqlalchemy", "peewee", "sprout-postgres"]
LIVE = 10
TUNED_PRAGMAS = {"journal_mode": "wal", "synchronous": "normal", "mmap_size": 256 << 20, "cache_size": -(64 << 10), "temp_store": "memory"}


@dataclass
class Record:
    key: int
    payload: bytes


class Workload:
    """The same sequence of operations for every system (seeded per size)."""

    def __init__(self, size, iterations, seed):
        self.size, self.iterations, self.rng = size, iterations, random.Random(seed * 100_003 + size)
        self.expected = {}

    def steps(self):
        for i in range(self.iterations):
            live = list(self.expected)
            update = self.rng.choice(live) if live else None
            delete = live[0] if len(live) >= LIVE else None
            yield i, self.rng.randbytes(self.size), update, self.rng.randbytes(self.size), delete


def check(expected, got, system, i):
    if got != expected:
        missing = set(expected) - set(got)
        extra = set(got) - set(expected)
        wrong = [k for k in expected if k in got and got[k] != expected[k]]
        raise SystemExit(f"{system}: the database does not hold the expected values after iteration {i}: "
                         f"missing {sorted(missing)[:5]}, extra {sorted(extra)[:5]}, wrong {wrong[:5]}")


def run_sprout(url, work):
    with store.open(url) as db:
        table = db.table(Record)
        objects = {}
        for i, payload, update, new_payload, delete in work.steps():
            rec = Record(i, payload)
            table.save(rec)
            objects[i] = rec
            work.expected[i] = payload
            if update is not None:
                objects[update].payload = new_payload
                table.save(objects[update])
                work.expected[update] = new_payload
            if delete is not None:
                table.delete(objects.pop(delete))
                del work.expected[delete]
            check(work.expected, {r.key: r.payload for r in table.all()}, "sprout", i)


def run_sqlite3(path, work, tuned):
    conn = sqlite3.connect(path, isolation_level=None if tuned else "")
    if tuned:
        conn.execute("PRAGMA page_size = 4096")
        for name, value in TUNED_PRAGMAS.items():
            conn.execute(f"PRAGMA {name} = {value}")
    conn.execute("CREATE TABLE record (id INTEGER PRIMARY KEY, key INTEGER NOT NULL, payload BLOB NOT NULL)")
    conn.commit()
    ids = {}
    for i, payload, update, new_payload, delete in work.steps():
        ids[i] = conn.execute("INSERT INTO record (key, payload) VALUES (?, ?)", (i, payload)).lastrowid
        conn.commit()
        work.expected[i] = payload
        if update is not None:
            conn.execute("UPDATE record SET payload = ? WHERE id = ?", (new_payload, ids[update]))
            conn.commit()
            work.expected[update] = new_payload
        if delete is not None:
            conn.execute("DELETE FROM record WHERE id = ?", (ids.pop(delete),))
            conn.commit()
            del work.expected[delete]
        check(work.expected, dict(conn.execute("SELECT key, payload FROM record").fetchall()), "sqlite3", i)
    conn.close()


def run_sqlalchemy(path, work):
    from sqlalchemy import LargeBinary, create_engine, event, select
    from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

    class Base(DeclarativeBase):
        pass

    class Rec(Base):
        __tablename__ = "record"
        id: Mapped[int] = mapped_column(primary_key=True)
        key: Mapped[int]
        payload: Mapped[bytes] = mapped_column(LargeBinary)

    engine = create_engine(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def tune(dbapi_conn, _):
        dbapi_conn.execute("PRAGMA page_size = 4096")
        for name, value in TUNED_PRAGMAS.items():
            dbapi_conn.execute(f"PRAGMA {name} = {value}")

    Base.metadata.create_all(engine)
    with Session(engine) as session:
        objects = {}
        for i, payload, update, new_payload, delete in work.steps():
            rec = Rec(key=i, payload=payload)
            session.add(rec)
            session.commit()
            objects[i] = rec
            work.expected[i] = payload
            if update is not None:
                objects[update].payload = new_payload
                session.commit()
                work.expected[update] = new_payload
            if delete is not None:
                session.delete(objects.pop(delete))
                session.commit()
                del work.expected[delete]
            check(work.expected, {r.key: r.payload for r in session.scalars(select(Rec))}, "sqlalchemy", i)
    engine.dispose()


def run_peewee(path, work):
    import peewee

    database = peewee.SqliteDatabase(path, pragmas={"page_size": 4096, **TUNED_PRAGMAS})

    class Rec(peewee.Model):
        key = peewee.IntegerField()
        payload = peewee.BlobField()

        class Meta:
            table_name = "record"

    database.bind([Rec])
    database.connect()
    database.create_tables([Rec])
    objects = {}
    for i, payload, update, new_payload, delete in work.steps():
        objects[i] = Rec.create(key=i, payload=payload)
        work.expected[i] = payload
        if update is not None:
            objects[update].payload = new_payload
            objects[update].save()
            work.expected[update] = new_payload
        if delete is not None:
            objects.pop(delete).delete_instance()
            del work.expected[delete]
        check(work.expected, {r.key: bytes(r.payload) for r in Rec.select()}, "peewee", i)
    database.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    systems = args.systems.split(",")
    pinned = os.cpu_count() > max(args.server_cpu, args.client_cpu) and args.server_cpu != args.client_cpu
    if pinned:
        os.sched_setaffinity(0, {args.client_cpu})
    work_dir = tempfile.mkdtemp(prefix="sprout-bench-store-", dir="/var/tmp")
    pg = None
    results = {s: {} for s in systems}
    try:
        if "sprout-postgres" in systems:
            from sprout.store.pgserver import TempPostgres

            pg = TempPostgres().start()
            if pinned:
                pid = int(open(os.path.join(pg.dir, "data", "postmaster.pid")).readline())
                os.system(f"taskset -a -p -c {args.server_cpu} {pid} > /dev/null")
        for size in sizes:
            runs = {system: [] for system in systems}
            for repeat in range(args.repeats):
                for system in systems:
                    runs[system].append(measure(system, size, args, work_dir, pg, repeat))
            for system in systems:
                ordered = sorted(runs[system])
                median = ordered[len(ordered) // 2]
                results[system][str(size)] = median
                spread = f"{ordered[0]:.0f}-{ordered[-1]:.0f}"
                print(f"  {size:>6} B {system:>16}: {median:>9.0f} writes/s (runs {spread})", flush=True)
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    summarize(args, results, sizes, pinned)


def measure(system, size, args, work_dir, pg, repeat):
    """One run of one system at one size; returns writes per second."""
    work = Workload(size, args.iterations, args.seed)
    path = os.path.join(work_dir, f"{system}-{size}.db")
    started = time.perf_counter()
    if system == "sprout-sqlite":
        run_sprout(f"sqlite://{path}", work)
    elif system == "sqlite3-default":
        run_sqlite3(path, work, tuned=False)
    elif system == "sqlite3-tuned":
        run_sqlite3(path, work, tuned=True)
    elif system == "sqlalchemy":
        run_sqlalchemy(path, work)
    elif system == "peewee":
        run_peewee(path, work)
    elif system == "sprout-postgres":
        run_sprout(pg.create_database(f"bench{size}r{repeat}"), work)
    else:
        raise SystemExit(f"unknown system {system}")
    elapsed = time.perf_counter() - started
    for leftover in (path, path + "-wal", path + "-shm", path + "-journal"):
        if os.path.exists(leftover):
            os.remove(leftover)
    writes = args.iterations * 3 - 1 - LIVE  # inserts, updates (from the second), deletes (from the eleventh)
    return writes / elapsed


def versions():
    import peewee
    import psycopg
    import sqlalchemy

    return {"python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version, "sqlalchemy": sqlalchemy.__version__,
            "peewee": peewee.__version__, "psycopg": psycopg.__version__}


def summarize(args, results, sizes, pinned):
    def ratio(a, b, size):
        x, y = results.get(a, {}).get(str(size)), results.get(b, {}).get(str(size))
        return x / y if x and y else None

    ratios = {
        "sprout_over_sqlalchemy": {str(s): ratio("sprout-sqlite", "sqlalchemy", s) for s in sizes},
        "sqlite3_tuned_over_sprout": {str(s): ratio("sqlite3-tuned", "sprout-sqlite", s) for s in sizes},
        "sprout_over_sqlite3_default": {str(s): ratio("sprout-sqlite", "sqlite3-default", s) for s in sizes},
        "sprout_over_peewee": {str(s): ratio("sprout-sqlite", "peewee", s) for s in sizes},
    }
    def target(name, values, test):
        present = [v for v in values if v is not None]
        return {"target": name, "measured": present, "met": all(test(v) for v in present) if present else None}

    big = [ratios["sprout_over_sqlite3_default"][str(s)] for s in sizes if s >= 4096]
    targets = [
        target(">= 2x SQLAlchemy ORM at every size", list(ratios["sprout_over_sqlalchemy"].values()), lambda v: v >= 2),
        target("within 1.3x of hand-written sqlite3 on the same settings, every size",
               list(ratios["sqlite3_tuned_over_sprout"].values()), lambda v: v <= 1.3),
        target("faster than stock default-settings sqlite3 at 4 KiB and above", big, lambda v: v > 1),
    ]
    import platform
    out = {
        "machine": f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), Linux {platform.release()}",
        "method": {
            "workload": f"{args.iterations} iterations per size: insert, update a random live record, delete the oldest of {LIVE} live; "
                        "then read back and compare every live record; each write its own transaction",
            "metric": f"writes per second, checks included; the median of {args.repeats} interleaved runs",
            "pinning": f"benchmark process on CPU {args.client_cpu}, PostgreSQL server on CPU {args.server_cpu}" if pinned else "none",
            "storage": "/var/tmp (a disk-backed file system)",
            "versions": versions(),
        },
        "systems": results,
        "ratios": ratios,
        "targets": targets,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "store.json"), "w") as f:
        json.dump(out, f, indent=2)
    with open(os.path.join(args.out, "store.md"), "w") as f:
        f.write(markdown(out, sizes))
    print(json.dumps(targets, indent=2))


def markdown(out, sizes):
    label = lambda s: f"{s} B" if s < 1024 else f"{s // 1024} KiB"
    lines = [f"{out['method']['workload']}. {out['method']['pinning']}.", "",
             "| system | " + " | ".join(label(s) for s in sizes) + " |", "|---|" + "---:|" * len(sizes)]
    for system, values in out["systems"].items():
        lines.append(f"| {system} | " + " | ".join(f"{values[str(s)]:.0f}" if str(s) in values else "—" for s in sizes) + " |")
    lines += ["", "Writes per second (higher is better).", "", "| target | measured | met |", "|---|---|---|"]
    for t in out["targets"]:
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {', '.join(f'{v:.2f}' for v in t['measured'])} | {met} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
