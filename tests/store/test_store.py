"""sprout.store on both backends (each test runs against SQLite and a real PostgreSQL): every
supported type round-trips, identity is one row per object, references and lists of
dataclasses are saved with their parent and loaded eagerly or lazily, typed queries of every
form, errors at build time, indexes, generated code."""

import dataclasses
import datetime as dt
import enum

import pytest

import sprout.store as store
from sprout.store import And, Contains, In, IsNull, Not, Or


class Color(enum.Enum):
    RED = 1
    GREEN = 2
    BLUE = 3


@dataclasses.dataclass
class Address:
    city: str
    zip: str = store.field(index=True, default="")


@dataclasses.dataclass
class Everything:
    i: int
    f: float
    b: bool
    s: str
    raw: bytes
    when: dt.datetime
    day: dt.date
    color: Color
    maybe: int | None = None
    maybe_text: str | None = None
    ints: list[int] = dataclasses.field(default_factory=list)
    names: list[str] = dataclasses.field(default_factory=list)
    scores: dict[str, float] = dataclasses.field(default_factory=dict)
    flags: dict[str, bool | None] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Person:
    name: str
    age: int = store.field(index=True, default=0)
    home: Address | None = None
    work: Address | None = store.field(lazy=True, default=None)
    places: list[Address] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Frozen:
    key: str
    value: int


@dataclasses.dataclass(slots=True, weakref_slot=True)
class Slotted:
    key: str
    value: int = 0


def sample(n=1):
    return Everything(
        i=-(2 ** 62) + n, f=2.5 * n, b=n % 2 == 0, s=f"héllo {n} ✓", raw=bytes(range(256)) * n,
        when=dt.datetime(2026, 11, 22, 12, 30, 15, 123456), day=dt.date(2026, 1, n), color=Color(n % 3 + 1),
        maybe=None if n % 2 else n, maybe_text="x" * n, ints=[1, -2, 3 * n], names=["a", "b"],
        scores={"math": 9.5, "art": n}, flags={"yes": True, "unknown": None},
    )


def test_every_field_type_round_trips(db):
    table = db.table(Everything)
    values = [sample(n) for n in range(1, 5)]
    ids = [table.save(v) for v in values]
    for rowid, value in zip(ids, values):
        assert table.get(rowid) == value
    aware = sample(9)
    aware.when = dt.datetime(2026, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    got = table.get(table.save(aware)).when
    assert got == aware.when and got.utcoffset() == dt.timedelta(0)  # the same instant, kept in UTC


def test_frozen_and_slotted_dataclasses(db):
    frozen = db.table(Frozen)
    rowid = frozen.save(Frozen("k", 1))
    assert frozen.get(rowid) == Frozen("k", 1)
    slotted = db.table(Slotted)
    s = Slotted("k", 2)
    rowid = slotted.save(s)
    s.value = 3
    assert slotted.save(s) == rowid and slotted.get(rowid) == Slotted("k", 3)


def test_a_value_saved_twice_is_one_row_with_a_stable_id(db):
    people = db.table(Person)
    ada = Person("ada", 36)
    first = people.save(ada)
    ada.age = 37
    assert people.save(ada) == first and people.count() == 1
    loaded = people.get(first)
    loaded.age = 38
    assert people.save(loaded) == first and people.get(first).age == 38
    assert people.id_of(loaded) == first and people.id_of(Person("ada", 38)) is None
    other = people.save(Person("ada", 38))  # an equal but distinct object is another row
    assert other != first and people.count() == 2
    assert people.delete(ada) and people.count() == 1
    with pytest.raises(store.NotFound):
        people.get(first)


def test_a_copy_of_a_saved_object_is_a_new_object(db):
    import copy

    people = db.table(Person)
    ada = people.get(people.save(Person("ada", 36)))
    twin = copy.copy(ada)
    twin.name = "twin"
    assert people.id_of(twin) is None and people.save(twin) != people.id_of(ada)
    assert sorted(p.name for p in people.all()) == ["ada", "twin"]
    again = dataclasses.replace(ada, age=40)
    assert people.save(again) not in (people.id_of(ada), people.id_of(twin)) and people.count() == 3


def test_references_are_saved_with_their_parent_and_loaded_eagerly(db):
    people = db.table(Person)
    home = Address("London", "N1")
    rowid = people.save(Person("ada", home=home, places=[Address("Paris"), home]))
    assert db.table(Address).count() == 2  # home saved once, though referenced twice
    home.city = "Cambridge"
    people.save(people.get(rowid))  # saving the parent saves (updates) its children
    loaded = people.get(rowid)
    assert loaded.home == Address("London", "N1")  # the loaded copy, saved as it was
    assert [p.city for p in loaded.places] == ["Paris", "London"]
    db.table(Address).save(home)
    assert people.get(rowid).home.city == "Cambridge"
    everyone = people.query().all()
    assert len(everyone) == 1 and everyone[0].home.zip == "N1"


def test_lazy_references_load_on_first_access(db):
    people = db.table(Person)
    rowid = people.save(Person("ada", work=Address("Cambridge", "CB2")))
    loaded = people.get(rowid)
    assert type(loaded.work) is not Address and isinstance(loaded.work, Address)  # a stand-in
    assert loaded.work.city == "Cambridge" and type(loaded.work) is Address
    again = people.get(rowid)
    assert again.work == Address("Cambridge", "CB2")  # equality loads it too
    again.work.city = "Oxford"
    people.save(again)
    assert people.get(rowid).work.city == "Oxford"


def test_lists_of_dataclasses_keep_their_order_and_follow_updates(db):
    people = db.table(Person)
    ada = Person("ada", places=[Address("a"), Address("b"), Address("c")])
    rowid = people.save(ada)
    ada.places.reverse()
    ada.places.pop()
    people.save(ada)
    assert [p.city for p in people.get(rowid).places] == ["c", "b"]
    people.delete(rowid)
    assert people.count() == 0


def test_typed_queries(db):
    people = db.table(Person)
    f = people.fields
    london = Address("London")
    for name, age, home in [("ada", 36, london), ("bob", 17, None), ("cyd", 52, Address("Paris")), ("dee", 36, None)]:
        people.save(Person(name, age, home))
    names = lambda q: sorted(p.name for p in q)
    assert names(people.query(f.age == 36)) == ["ada", "dee"]
    assert names(people.query(f.age != 36)) == ["bob", "cyd"]
    assert names(people.query((f.age >= 18) & (f.age < 40))) == ["ada", "dee"]
    assert names(people.query(f.age.between(17, 36))) == ["ada", "bob", "dee"]
    assert names(people.query(f.name.contains("d"))) == ["ada", "cyd", "dee"]
    assert names(people.query(Contains(f.name, "e"))) == ["dee"]
    assert names(people.query(f.name.in_(["bob", "cyd", "zed"]))) == ["bob", "cyd"]
    assert names(people.query(In(f.age, []))) == []
    assert names(people.query(IsNull(f.home))) == ["bob", "dee"]
    assert names(people.query(f.home == None)) == ["bob", "dee"]  # noqa: E711
    assert names(people.query(f.home != None)) == ["ada", "cyd"]  # noqa: E711
    assert names(people.query(f.home == london)) == ["ada"]
    assert names(people.query(Or(f.age < 18, f.age > 50))) == ["bob", "cyd"]
    assert names(people.query(And(f.age == 36, Not(f.name == "ada")))) == ["dee"]
    assert names(people.query(~(f.age == 36) | f.name.contains("a"))) == ["ada", "bob", "cyd"]
    ordered = people.query().order_by(f.age.desc(), f.name)
    assert [p.name for p in ordered] == ["cyd", "ada", "dee", "bob"]
    assert [p.name for p in ordered.limit(2)] == ["cyd", "ada"]
    assert [p.name for p in ordered.offset(1).limit(2)] == ["ada", "dee"]
    assert [p.name for p in ordered.offset(3)] == ["bob"]
    assert people.query(f.age == 36).count() == 2 and people.count() == 4
    # Counting an ordered query ignores the order (PostgreSQL refuses ORDER BY beside COUNT).
    assert ordered.count() == 4 and people.query(f.age == 36).order_by(f.name).count() == 2
    assert people.query(f.age > 100).first() is None
    assert people.query(f.age == 17).first().name == "bob"
    assert len(people.query(f.age == 36).ids()) == 2
    assert people.query(f.age == 36).delete() == 2 and people.count() == 2


def test_a_python_predicate_filters_after_the_database(db):
    people = db.table(Person)
    for i in range(10):
        people.save(Person(f"p{i}", i))
    f = people.fields
    q = people.query(f.age >= 2).filter(lambda p: p.age % 3 == 0).order_by(f.age)
    assert [p.age for p in q] == [3, 6, 9]
    assert [p.age for p in q.limit(2)] == [3, 6] and [p.age for p in q.offset(1)] == [6, 9]
    assert q.count() == 3 and q.first().age == 3


@pytest.mark.parametrize("build, message", [
    (lambda f: f.nope == 1, "has no field 'nope'"),
    (lambda f: f.age == "36", "Person.age is an int"),
    (lambda f: f.age == True, "Person.age is an int"),  # noqa: E712
    (lambda f: f.name < 3, "Person.name is a str"),
    (lambda f: f.age.contains("3"), "Contains needs a str field"),
    (lambda f: f.name.contains(3), "needs a str"),
    (lambda f: f.name.in_(["a", 1]), "Person.name is a str"),
    (lambda f: f.name.in_("abc"), "a collection"),
    (lambda f: f.age.is_null(), "never None"),
    (lambda f: f.home < Address("x"), "has no order"),
    (lambda f: f.home == Address("unsaved"), "saved Address"),
    (lambda f: f.places == [], "cannot be compared"),
    (lambda f: f.age > None, "cannot be ordered against None"),
    (lambda f: (f.age > 1) and (f.age < 3), "no truth value"),
])
def test_bad_queries_fail_when_built(db, build, message):
    people = db.table(Person)
    with pytest.raises(store.QueryError) as err:
        build(people.fields)
    assert message in str(err.value)


def test_values_that_do_not_match_their_type_are_rejected_and_nothing_is_written(db):
    people = db.table(Person)
    with pytest.raises(store.ValidationError) as err:
        people.save(Person("ada", age="old"))
    assert "Person.age" in str(err.value) and err.value.field == "age"
    with pytest.raises(store.ValidationError, match="Address.city"):
        people.save(Person("bob", home=Address(city=42)))  # the child is invalid: the parent is not written either
    with pytest.raises(store.ValidationError, match="Person.places"):
        people.save(Person("cyd", places=[Address("a"), "b"]))
    table = db.table(Everything)
    bad = sample()
    bad.ints = [1, "2"]
    with pytest.raises(store.ValidationError, match="Everything.ints"):
        table.save(bad)
    bad = sample()
    bad.scores = {1: 2.0}
    with pytest.raises(store.ValidationError, match="Everything.scores"):
        table.save(bad)
    with pytest.raises(store.ValidationError):
        people.save(Address("not a person"))
    assert people.count() == 0 and db.table(Address).count() == 0 and table.count() == 0


def test_unsupported_types_are_refused_naming_the_field(db):
    @dataclasses.dataclass
    class Bad:
        values: set[int]

    @dataclasses.dataclass
    class Mixed:
        value: int | str

    @dataclasses.dataclass
    class HasId:
        id: int

    for cls, needle in [(Bad, "Bad.values"), (Mixed, "unions"), (HasId, "HasId.id")]:
        with pytest.raises(store.SchemaError, match=needle):
            db.table(cls)
    with pytest.raises(store.SchemaError, match="not a dataclass"):
        db.table(int)


def test_declared_indexes_exist(db):
    db.table(Person)
    if db.engine == "sqlite":
        names = {r[0] for r in db.backend.rows("SELECT name FROM sqlite_master WHERE type = 'index'")}
    else:
        names = {r[0] for r in db.backend.rows("SELECT indexname FROM pg_indexes")}
    assert {"person__age", "address__zip"} <= names


def test_code_is_generated_once_per_type_and_reused(db):
    people = db.table(Person)
    encode = people.encode
    for i in range(3):
        people.save(Person(f"p{i}"))
    assert db.table(Person) is people and people.encode is encode
    assert "def encode(obj, save_ref)" in encode.source and "getattr" not in encode.source
    assert "def decode(row)" in people.decode.source


def test_save_many_inserts_in_one_batch_with_identities(db):
    people = db.table(Person)
    batch = [Person(f"p{i}", i) for i in range(50)]
    ids = people.save_many(batch)
    assert len(set(ids)) == 50 and people.count() == 50
    assert [people.get(i).age for i in ids[:3]] == [0, 1, 2]
    batch[0].age = 99
    assert people.save(batch[0]) == ids[0] and people.get(ids[0]).age == 99


def test_transactions_commit_or_roll_back_and_nest(db):
    people = db.table(Person)
    with db.transaction():
        people.save(Person("a"))
        people.save(Person("b"))
    with pytest.raises(RuntimeError):
        with db.transaction():
            people.save(Person("c"))
            raise RuntimeError("abandon")
    assert sorted(p.name for p in people.all()) == ["a", "b"]
    with db.transaction():
        people.save(Person("d"))
        with pytest.raises(RuntimeError):
            with db.transaction():  # a savepoint
                people.save(Person("e"))
                raise RuntimeError("inner")
        people.save(Person("f"))
    assert sorted(p.name for p in people.all()) == ["a", "b", "d", "f"]
