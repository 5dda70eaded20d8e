"""Database.drop on both backends: a type's table, link tables and schema record go, rows and
all; the next use makes it afresh with ids from 1; tables not made by the store are left
alone; inside a transaction that rolls back, nothing is dropped."""

import dataclasses

import pytest

import sprout.store as store


@dataclasses.dataclass
class Place:
    city: str


@dataclasses.dataclass
class Traveller:
    name: str = store.field(unique=True)
    age: int = store.field(index=True, default=0)
    home: Place | None = None
    visited: list[Place] = dataclasses.field(default_factory=list)


def tables(db):
    """The names of the database's tables."""
    if db.engine == "sqlite":
        return {r[0] for r in db.backend.rows("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return {r[0] for r in db.backend.rows("SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")}


def recorded(db):
    return {r[0] for r in db.backend.rows('SELECT name FROM "_sprout_schema"')}


def test_drop_removes_the_table_its_link_tables_and_its_record(db):
    travellers = db.table(Traveller)
    travellers.save(Traveller("ada", 36, Place("London"), [Place("Paris"), Place("Turin")]))
    assert {"traveller", "traveller__visited", "place"} <= tables(db)

    assert db.drop(Traveller) is True
    assert "traveller" not in tables(db) and "traveller__visited" not in tables(db)
    assert "traveller" not in recorded(db)
    # The types it referred to keep their table and rows.
    assert db.table(Place).count() == 3

    again = db.table(Traveller)
    assert again is not travellers and again.count() == 0
    assert again.save(Traveller("ada", 1)) == 1  # fresh: ids from 1, the unique name free again
    assert [t.name for t in again.all()] == ["ada"]


def test_drop_of_a_type_never_stored_is_false_and_harmless(db):
    assert db.drop(Place) is False
    assert db.drop(Place) is False
    assert db.table(Place).save(Place("Oslo")) == 1


def test_drop_leaves_a_table_the_store_did_not_make(db):
    db.backend.execute('CREATE TABLE "place" (city TEXT)')
    db.backend.execute("INSERT INTO \"place\" (city) VALUES ('kept')")
    with pytest.raises(store.SchemaError, match="not made by sprout.store"):
        db.drop(Place)
    assert db.backend.rows('SELECT city FROM "place"') == [("kept",)]


def test_drop_in_a_transaction_that_rolls_back_drops_nothing(db):
    travellers = db.table(Traveller)
    travellers.save_many([Traveller(f"t{i}", i) for i in range(5)])
    with pytest.raises(RuntimeError):
        with db.transaction():
            db.drop(Traveller)
            assert "traveller" not in tables(db)
            raise RuntimeError("abandon")
    assert "traveller" in tables(db) and "traveller" in recorded(db)
    assert sorted(t.name for t in db.table(Traveller).all()) == [f"t{i}" for i in range(5)]
    assert db.table(Traveller).query(db.table(Traveller).fields.age >= 3).count() == 2


def test_drop_then_recreate_in_one_transaction(db):
    db.table(Traveller).save(Traveller("old", 1))
    with db.transaction():
        db.drop(Traveller)
        db.table(Traveller).save(Traveller("new", 2))
    assert [(db.table(Traveller).id_of(t), t.name) for t in db.table(Traveller).all()] == [(1, "new")]
