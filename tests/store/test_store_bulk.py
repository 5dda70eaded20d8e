"""save_many's batches on both backends (PostgreSQL sends them with COPY): types with nested
dataclasses are inserted referenced rows first, one batch per type, giving the same rows and
ids as saving one by one; shared objects are saved once, known ones updated; a bad object
anywhere leaves nothing written; types that can cycle fall back to one by one."""

import dataclasses
import datetime as dt
from typing import Optional

import pytest

import sprout.store as store


@dataclasses.dataclass
class Spot:
    city: str
    lat: float = 0.0


@dataclasses.dataclass
class Picture:
    name: str
    size: int = 0


@dataclasses.dataclass
class Gig:
    title: str
    when: dt.datetime
    spot: Spot | None = None
    picture: Picture | None = None
    backup: Spot | None = None
    free: bool = False
    day: dt.date | None = None
    note: str | None = None
    raw: bytes = b""


@dataclasses.dataclass
class Node:  # refers to its own type: can cycle
    name: str
    parent: Optional["Node"] = None


def gigs(n, shared=None):
    out = []
    for i in range(n):
        out.append(Gig(f"gig {i}", dt.datetime(2025, 1, 1, 12, i % 60), Spot(f"city {i}", i / 3),
                       Picture(f"p{i}.jpg", i) if i % 2 else None, shared, i % 3 == 0,
                       dt.date(2025, 2, 1 + i % 28), None if i % 4 else "it's a \"note\"\twith\\tabs\nand lines",
                       bytes(range(i % 256))))
    return out


def dump(db, cls):
    table = db.table(cls)
    return sorted(((table.id_of(o), o) for o in table.all()), key=lambda pair: pair[0])


def test_batches_give_the_rows_and_ids_of_saving_one_by_one(db):
    for gig in gigs(30, Spot("everywhere")):
        db.table(Gig).save(gig)
    one_by_one = {cls: dump(db, cls) for cls in (Gig, Spot, Picture)}
    for cls in (Gig, Spot, Picture):
        db.drop(cls)
    shared = Spot("everywhere")
    batch = gigs(30, shared)
    ids = db.table(Gig).save_many(batch)
    assert ids == list(range(1, 31))
    assert {cls: dump(db, cls) for cls in (Gig, Spot, Picture)} == one_by_one
    # The shared spot is one row (saved after the first gig's own); every object knows its row.
    assert db.table(Spot).count() == 31 and db.table(Spot).id_of(shared) == 2
    assert [db.table(Gig).id_of(g) for g in batch] == ids


def test_known_referenced_objects_are_updated_not_copied(db):
    spot = Spot("before")
    db.table(Spot).save(spot)
    spot.city = "after"
    db.table(Gig).save_many([Gig("a", dt.datetime(2025, 1, 1), spot), Gig("b", dt.datetime(2025, 1, 2), spot)])
    assert [s.city for s in db.table(Spot).all()] == ["after"]
    assert {g.spot.city for g in db.table(Gig).all()} == {"after"}


def test_a_bad_object_leaves_nothing_written(db):
    batch = gigs(10)
    batch[7].spot = "not a spot"
    with pytest.raises(store.ValidationError, match="Gig.spot"):
        db.table(Gig).save_many(batch)
    assert db.table(Gig).count() == 0 and db.table(Spot).count() == 0 and db.table(Picture).count() == 0
    batch[7].spot = Spot("fixed")
    batch[3].picture.size = "big"
    with pytest.raises(store.ValidationError, match="Picture.size"):
        db.table(Gig).save_many(batch)
    assert db.table(Gig).count() == 0 and db.table(Spot).count() == 0 and db.table(Picture).count() == 0
    batch[3].picture.size = 3
    assert db.table(Gig).save_many(batch) == list(range(1, 11))


def test_a_unique_violation_in_a_batch_leaves_nothing_written(db):
    @dataclasses.dataclass
    class Handle:
        name: str = store.field(unique=True)

    db.table(Handle).save(Handle("taken"))
    with pytest.raises(Exception) as error:
        db.table(Handle).save_many([Handle("free"), Handle("taken")])
    assert "unique" in str(error.value).lower()
    assert [h.name for h in db.table(Handle).all()] == ["taken"]


def test_types_that_can_cycle_are_saved_one_by_one(db):
    root = Node("root")
    children = [Node(f"child {i}", root) for i in range(3)]
    ids = db.table(Node).save_many(children)
    assert db.table(Node).count() == 4 and len(set(ids)) == 3
    assert {n.parent.name for n in db.table(Node).all() if n.parent} == {"root"}


def test_batches_continue_the_ids_after_single_saves(db):
    spots = db.table(Spot)
    spots.save(Spot("one"))
    assert spots.save_many([Spot("two"), Spot("three")]) == [2, 3]
    assert spots.save(Spot("four")) == 4
    assert spots.save_many([]) == []
    assert [s.city for s in spots.query().order_by(spots.fields.city).all()] == ["four", "one", "three", "two"]


@dataclasses.dataclass
class Visit:
    who: int = store.field(index=True)
    where: str = store.field(index=True, default="")
    ticket: str = store.field(unique=True, default="")


def index_names(db):
    if db.engine == "sqlite":
        rows = db.backend.rows("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'visit'")
    else:
        rows = db.backend.rows("SELECT indexname FROM pg_indexes WHERE tablename = 'visit' AND indexname LIKE 'visit__%%'")
    return {r[0] for r in rows if "__" in r[0]}


def test_bulk_load_builds_the_indexes_after_the_rows(db):
    visits = db.table(Visit)
    every = {"visit__who", "visit__where", "visit__ticket"}
    assert index_names(db) == every
    with db.bulk_load(Visit):
        assert index_names(db) == {"visit__ticket"}  # unique indexes stay
        visits.save_many([Visit(i % 7, f"w{i % 3}", f"t{i}") for i in range(500)])
        with pytest.raises(Exception, match="(?i)unique"):
            with db.transaction():
                visits.save(Visit(1, "dup", "t3"))
    assert index_names(db) == every
    assert visits.query(visits.fields.who == 3).count() == len([i for i in range(500) if i % 7 == 3])


def planner_rows(db, table):
    """The row count in the planner's column statistics of a table (None: none gathered)."""
    if db.engine == "sqlite":
        if not db.backend.rows("SELECT name FROM sqlite_master WHERE name = 'sqlite_stat1'"):
            return None
        rows = db.backend.rows(f"SELECT stat FROM sqlite_stat1 WHERE tbl = '{table}'")
        return int(rows[0][0].split()[0]) if rows else None
    # CREATE INDEX sets reltuples too; only ANALYZE fills pg_stats.
    if not db.backend.rows(f"SELECT 1 FROM pg_stats WHERE tablename = '{table}'"):
        return None
    return int(db.backend.rows(f"SELECT reltuples FROM pg_class WHERE relname = '{table}'")[0][0])


def test_bulk_load_leaves_the_planner_statistics_of_what_it_loaded(db):
    visits = db.table(Visit)
    assert planner_rows(db, "visit") is None
    with db.bulk_load(Visit):
        visits.save_many([Visit(i % 7, f"w{i % 3}", f"t{i}") for i in range(300)])
    assert planner_rows(db, "visit") == 300


def test_bulk_load_that_fails_leaves_rows_and_indexes_as_they_were(db):
    visits = db.table(Visit)
    visits.save(Visit(1, "kept", "k"))
    with pytest.raises(RuntimeError):
        with db.bulk_load(Visit):
            visits.save_many([Visit(2, "lost", f"l{i}") for i in range(10)])
            raise RuntimeError("abandon")
    assert index_names(db) == {"visit__who", "visit__where", "visit__ticket"}
    assert [v.where for v in visits.all()] == ["kept"]
