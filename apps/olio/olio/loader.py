"""Fill an Olio database (and its file store) with Cloudstone's deterministic data set.

    PYTHONPATH=python:apps/olio python3 -m olio.loader --users 100000 --seed 1 \\
        --db postgresql://postgres@127.0.0.1:5432/olio --files /var/lib/olio/files

Scale: `--users N` registered users, or `--concurrent C` for Olio's rule of 100 x C users.
Cloudstone counts results only for U = log10(users) >= 3: smaller loads are refused unless
`--allow-small`, and then the summary says the data is not valid for Cloudstone. What each
table holds, and how it is drawn from the seed, is in `olio.loader_rows`; the pictures and
PDFs in `olio.loader_files`. The same seed, scale and `--today` give the same rows, ids and
files, byte for byte.

A database that already holds Olio data is refused (exit status 2) unless `--recreate`.
The whole load (dropping Olio's tables with --recreate, creating them afresh so ids count
from 1, inserting every row) is one transaction: if anything fails, or the load is
interrupted, the database is left as it was. Files are written once the database is found
fit to load (content-named, so rewriting them is harmless, and a failed load leaves only
files a later one writes again); loader files no longer used are removed after the commit.

Progress goes to stderr (a bar per table on a terminal, a line per table otherwise, nothing
with --quiet); the summary goes to stdout. Exit status: 0 loaded, 2 refused (bad scale,
existing data), 1 anything else (unreachable database, unwritable file store...).
"""

import argparse
import itertools
import math
import os
import sys
import time
from datetime import UTC, date, datetime

import sprout.store as store

from . import config as olio_config
from . import loader_files
from .loader_rows import Rows, event_count, tag_count
from .models import ALL, Attendance, Comment, Event, Invite, Tag, Tagging, User

CLOUDSTONE_MIN_USERS = 1000  # U = log10(users) >= 3
OLIO_MIN_CONCURRENT = 25
SMALLEST = 10  # below this even --allow-small makes no sense (2 tags, 6 events at 10 users)
BATCH = 2000


class Refused(Exception):
    """The load was not started: bad scale or existing data (exit status 2)."""


class LoadError(Exception):
    """The load failed; nothing was written to the database (exit status 1)."""


# ---------------------------------------------------------------------- progress


class Progress:
    """Per-table progress on `stream`: a `\\r` bar on a terminal, a line per table when not,
    nothing when quiet."""

    def __init__(self, stream=sys.stderr, quiet=False):
        self.stream = stream
        self.mode = "off" if quiet else "bar" if stream.isatty() else "lines"

    def table(self, name, total, unit="rows"):
        return _Bar(self, name, total, unit)


class _Bar:
    def __init__(self, progress, name, total, unit):
        self.progress, self.name, self.total, self.unit = progress, name, total, unit
        self.start = self.last = time.monotonic()
        self.done = 0

    def update(self, done):
        self.done = done
        now = time.monotonic()
        if self.progress.mode == "bar" and now - self.last >= 0.2:
            self.last = now
            elapsed = now - self.start
            rate = done / elapsed if elapsed > 0 else 0
            eta = (self.total - done) / rate if rate > 0 else 0
            percent = 100 * done / self.total if self.total else 100
            self._write(f"\r{self.name:<12} {done:>10,}/{self.total:,} {percent:3.0f}%"
                        f" {rate:>10,.0f} {self.unit}/s  ETA {eta:4.0f} s ")

    def close(self):
        elapsed = time.monotonic() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0
        line = f"{self.name:<12} {self.done:>10,} {self.unit} in {elapsed:6.1f} s ({rate:,.0f} {self.unit}/s)"
        if self.progress.mode == "bar":
            self._write(f"\r{line}{' ' * 12}\n")
        elif self.progress.mode == "lines":
            self._write(line + "\n")

    def _write(self, text):
        self.progress.stream.write(text)
        self.progress.stream.flush()


# ---------------------------------------------------------------------- the load


def check_scale(users, allow_small):
    """Refused unless `users` is a valid Cloudstone scale (or small loads are allowed)."""
    if users < SMALLEST:
        raise Refused(f"{users} users is too few to load (the least is {SMALLEST})")
    if users < CLOUDSTONE_MIN_USERS and not allow_small:
        raise Refused(f"{users} users gives U = log10({users}) = {math.log10(users):.4f} < 3; Cloudstone's results "
                      f"are valid only for U >= 3 (at least {CLOUDSTONE_MIN_USERS:,} users). "
                      f"Use --allow-small to load it anyway (for tests)")


def _batches(items, size):
    items = iter(items)
    while batch := list(itertools.islice(items, size)):
        yield batch


def _olio_rows(db, recreate):
    """{table: rows} of Olio's tables that hold rows; Refused if the schema differs and
    the tables are not to be dropped."""
    found = {}
    for cls in ALL:
        try:
            count = db.table(cls).count()
        except store.SchemaError as e:
            if recreate:
                continue
            raise Refused(f"the database holds Olio tables of another version ({e}); "
                          f"--recreate drops them and loads afresh") from None
        if count:
            found[cls.__name__] = count
    return found


def _insert(db, cls, name, rows, total, progress):
    """Insert `rows` (in batches) into the fresh table of `cls`; their ids must be 1..n."""
    table = db.table(cls)
    bar = progress.table(name, total)
    done = 0
    for batch in _batches(rows, BATCH):
        ids = table.save_many(batch)
        if ids != list(range(done + 1, done + len(batch) + 1)):
            raise LoadError(f"{name}: ids {ids[0]}..{ids[-1]} where {done + 1}..{done + len(batch)} were due: "
                            f"the table was not fresh (another process writing to it?)")
        done += len(batch)
        bar.update(done)
    bar.close()
    if done != total:
        raise LoadError(f"{name}: {done} rows made where {total} were planned")
    return done


def _fill(db, rows, progress):
    taggings = rows.taggings()
    pairs = rows.friendships()
    flat = itertools.chain.from_iterable
    _insert(db, Tag, "tags", rows.tag_rows(taggings), rows.tags, progress)
    _insert(db, User, "users", rows.user_rows(), rows.users, progress)
    _insert(db, Invite, "invites", rows.invite_rows(pairs), len(pairs), progress)
    _insert(db, Event, "events", rows.event_rows(), rows.events, progress)
    _insert(db, Tagging, "taggings", rows.tagging_rows(taggings), sum(map(len, taggings)), progress)
    _insert(db, Attendance, "attendances", flat(rows.attendance_rows()), sum(rows.attendance_counts()), progress)
    _insert(db, Comment, "comments", flat(rows.comment_rows()), sum(map(len, rows.ratings())), progress)


def load(db_url, files_dir, users, seed, today, recreate=False, progress=None):
    """Load Olio's data set; returns the summary ({"tables": {table: rows}, ...}).
    Raises Refused (nothing done) or LoadError / store errors (the database unchanged)."""
    check_scale(users, allow_small=True)
    progress = progress or Progress(quiet=True)
    started = time.monotonic()
    db = store.open(db_url)
    try:
        with db.transaction():
            existing = _olio_rows(db, recreate)
            if existing and not recreate:
                held = ", ".join(f"{name} {count:,}" for name, count in existing.items())
                raise Refused(f"the database already holds Olio data ({held} rows); "
                              f"--recreate drops Olio's tables and loads afresh")
            try:
                images, documents, names = loader_files.write_files(files_dir)
            except OSError as e:
                raise LoadError(f"cannot write the file store {files_dir}: {e.strerror} ({e.filename})") from None
            rows = Rows(seed, users, today, images, documents)
            for cls in ALL:
                db.drop(cls)  # fresh tables: ids from 1, in load order
            with db.bulk_load(*ALL):  # indexes built once, after the rows
                _fill(db, rows, progress)
                indexing = progress.table("(indexes)", len(ALL), unit="tables")
            indexing.update(len(ALL))
            indexing.close()
            tables = {cls.__name__: db.table(cls).count() for cls in ALL}
    finally:
        db.close()
    removed = loader_files.remove_others(files_dir, names)
    return {
        "users": users, "U": math.log10(users), "seed": seed, "today": today.isoformat(),
        "tags": tag_count(users), "events": event_count(users), "tables": tables,
        "files": len(names), "files_removed": removed, "seconds": time.monotonic() - started,
    }


def format_summary(summary, files_dir):
    lines = [f"Olio loaded: {summary['users']:,} users, U = log10(users) = {summary['U']:.2f}, "
             f"seed {summary['seed']}, reference day {summary['today']}, in {summary['seconds']:.1f} s"]
    if summary["users"] < CLOUDSTONE_MIN_USERS:
        lines.append("NOT VALID for Cloudstone: U < 3 (a small load, made with --allow-small)")
    for name, count in summary["tables"].items():
        lines.append(f"  {name:<12}{count:>12,}")
    lines.append(f"  files       {summary['files']:>12,} in {os.path.join(files_dir, loader_files.LOADER_DIR)}"
                 + (f" ({summary['files_removed']} stale ones removed)" if summary["files_removed"] else ""))
    return "\n".join(lines)


# ---------------------------------------------------------------------- command line


def parse_args(argv):
    defaults = olio_config.load()
    parser = argparse.ArgumentParser(prog="python3 -m olio.loader", description=__doc__.split("\n")[0])
    scale = parser.add_mutually_exclusive_group(required=True)
    scale.add_argument("--users", type=int, metavar="N", help="registered users (Cloudstone: at least 1,000)")
    scale.add_argument("--concurrent", type=int, metavar="C",
                       help=f"concurrent users; loads 100 x C users (Olio: C >= {OLIO_MIN_CONCURRENT})")
    parser.add_argument("--seed", type=int, default=1, metavar="S", help="the random seed (default 1)")
    parser.add_argument("--db", default=defaults.db, metavar="URL", help=f"sprout.store URL (default: Olio's config, {defaults.db})")
    parser.add_argument("--files", default=defaults.files, metavar="DIR", help=f"the file store (default: Olio's config, {defaults.files})")
    parser.add_argument("--today", type=date.fromisoformat, default=None, metavar="YYYY-MM-DD",
                        help="the reference day that dates count from (default: today, UTC)")
    parser.add_argument("--recreate", action="store_true", help="drop Olio's tables (and stale loader files) and load afresh")
    parser.add_argument("--allow-small", action="store_true", help="allow loads below Cloudstone's 1,000 users (not valid results)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return parser.parse_args(argv)


def main(argv=None):
    try:
        args = parse_args(argv)
    except olio_config.ConfigError as e:
        print(f"olio.loader: {e}", file=sys.stderr)
        return 2
    if args.concurrent is not None:
        if args.concurrent < OLIO_MIN_CONCURRENT and not args.allow_small:
            print(f"olio.loader: refused: Olio's scale is at least {OLIO_MIN_CONCURRENT} concurrent users, not "
                  f"{args.concurrent}; use --allow-small to load it anyway (for tests)", file=sys.stderr)
            return 2
        users = 100 * args.concurrent
    else:
        users = args.users
    today = args.today or datetime.now(UTC).date()  # the app's clock is UTC
    try:
        check_scale(users, args.allow_small)
        summary = load(args.db, args.files, users, args.seed, today, args.recreate,
                       Progress(sys.stderr, args.quiet))
    except Refused as e:
        print(f"olio.loader: refused: {e}", file=sys.stderr)
        return 2
    except (LoadError, store.StoreError) as e:
        print(f"olio.loader: failed, nothing was loaded: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nolio.loader: interrupted, nothing was loaded", file=sys.stderr)
        return 130
    print(format_summary(summary, args.files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
