"""sprout.store under concurrency, crashes, schema changes and bad databases, on both backends:
several processes (as several sandboxes would) updating one counter lose no update; a writer
killed with SIGKILL mid-transaction leaves every committed transaction whole and nothing of
the others; fields may be added, not changed; a file that is no database and a server that is
down are clear errors."""

import dataclasses
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sprout.store as store

WRITER = Path(__file__).resolve().parent / "store_writer.py"
sys.path.insert(0, str(WRITER.parent))

from store_writer import Counter, Ledger, Row  # noqa: E402


def writers(url, mode, processes, each):
    procs = [subprocess.Popen([sys.executable, str(WRITER), mode, url, str(each)], stderr=subprocess.PIPE, text=True)
             for _ in range(processes)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err


def test_several_processes_lose_no_update(db, store_url):
    counters = db.table(Counter)
    counters.save(Counter("shared"))
    writers(store_url, "counter", 4, 40)
    assert counters.query(counters.fields.name == "shared").first().value == 160


def test_optimistic_versions_turn_lost_updates_into_conflicts(db, store_url):
    counters = db.table(Counter)
    counters.save(Counter("shared"))
    writers(store_url, "versioned", 3, 30)
    final = counters.query(counters.fields.name == "shared").first()
    assert final.value == 90 and final.version == 90
    stale = counters.get(counters.id_of(final))
    final.value += 1
    counters.save(final)
    stale.value += 100
    with pytest.raises(store.ConflictError):
        counters.save(stale)
    assert counters.get(counters.id_of(final)).value == 91


def test_a_writer_killed_mid_transaction_leaves_committed_work_whole(db, store_url):
    db.table(Row)  # the row table exists before any writer starts
    ledgers = db.table(Ledger)
    ledgers.save(Ledger())
    seen = 0
    for round_ in range(8):
        writer = subprocess.Popen([sys.executable, str(WRITER), "batches", store_url], stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline().strip() == "ready"
        time.sleep(random.uniform(0.05, 0.4))
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        check = store.open(store_url)
        try:
            # One snapshot: the killed writer's last COMMIT may still land on the server (it
            # does not know its client is gone), between two reads made outside a transaction.
            with check.transaction():
                committed = check.table(Ledger).all()[0].batches
                r = check.table(Row)
                assert r.count() == 20 * committed, f"round {round_}: a half transaction survived"
                assert r.query(r.fields.batch > committed).count() == 0
                for batch in random.sample(range(1, committed + 1), min(5, committed)):
                    assert r.query(r.fields.batch == batch).count() == 20
            assert committed >= seen
            seen = committed
        finally:
            check.close()
    assert seen > 0, "the writer never committed anything before being killed"


@dataclasses.dataclass
class ItemV1:
    __sprout_table__ = "item"
    name: str


@dataclasses.dataclass
class Tag:
    label: str


@dataclasses.dataclass
class ItemV2:
    __sprout_table__ = "item"
    name: str
    price: float = 9.5
    labels: list[str] = dataclasses.field(default_factory=lambda: ["new"])
    maker: Tag | None = None
    tags: list[Tag] = dataclasses.field(default_factory=list)
    sku: str = store.field(index=True, default="")


@dataclasses.dataclass
class ItemChanged:
    __sprout_table__ = "item"
    name: str
    price: str = "9.5"
    labels: list[str] = dataclasses.field(default_factory=list)
    maker: Tag | None = None
    tags: list[Tag] = dataclasses.field(default_factory=list)
    sku: str = ""


@dataclasses.dataclass
class ItemDropped:
    __sprout_table__ = "item"
    name: str


@dataclasses.dataclass
class ItemNoDefault:
    __sprout_table__ = "item"
    name: str
    price: float
    labels: list[str]
    maker: Tag | None
    tags: list[Tag]
    sku: str
    weight: int


def test_adding_fields_adds_columns_and_incompatible_changes_change_nothing(store_url):
    with store.open(store_url) as db:
        old = db.table(ItemV1)
        first = old.save(ItemV1("chair"))
    with store.open(store_url) as db:
        items = db.table(ItemV2)
        assert items.get(first) == ItemV2("chair", 9.5, ["new"], None, [], "")
        second = items.save(ItemV2("table", 120.0, ["oak"], Tag("Ikea"), [Tag("big")], "T-1"))
        assert items.get(second).tags == [Tag("big")]
        assert items.query(items.fields.sku == "T-1").count() == 1
    for changed, needle in [(ItemChanged, "ItemChanged.price changed from float to str"),
                            (ItemDropped, "no longer has the stored field(s) price"),
                            (ItemNoDefault, "ItemNoDefault.weight is new and has no default")]:
        with store.open(store_url) as db:
            with pytest.raises(store.SchemaError) as err:
                db.table(changed)
            assert needle in str(err.value) and "nothing was changed" in str(err.value)
    with store.open(store_url) as db:  # the stored schema is as it was
        items = db.table(ItemV2)
        assert [i.name for i in items.query().order_by(items.fields.name)] == ["chair", "table"]


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not an SQLite database, only some text" * 100)
    with pytest.raises(store.ConnectError, match="not a database"):
        store.open(f"sqlite://{junk}")
    with pytest.raises(store.ConnectError, match="does not exist"):
        store.open(f"sqlite://{tmp_path}/no/such/dir/x.db")
    with pytest.raises(store.ConnectError, match="unknown database"):
        store.open("mysql://localhost/x")
    with pytest.raises(store.ConnectError, match="unknown SQLite options"):
        store.open(f"sqlite://{tmp_path}/x.db?jurnal=wal")


def test_a_server_that_is_down_is_a_clear_error():
    from sprout.store.pgserver import TempPostgres

    with pytest.raises(store.ConnectError, match="cannot connect to PostgreSQL.*refused"):
        store.open("postgresql://postgres@127.0.0.1:9/nothing")
    server = TempPostgres().start()
    try:
        db = store.open(server.create_database("going"))
        people = db.table(Tag)
        people.save(Tag("before"))
    finally:
        server.stop()
    with pytest.raises(store.StoreError, match="PostgreSQL"):
        people.save(Tag("after"))


def test_sqlite_settings_are_applied_and_switchable(tmp_path):
    with store.open(f"sqlite://{tmp_path}/tuned.db") as db:
        pragma = lambda name: db.backend.rows(f"PRAGMA {name}")[0][0]
        assert (pragma("journal_mode"), pragma("page_size"), pragma("synchronous")) == ("wal", 4096, 1)
        assert pragma("mmap_size") == 256 << 20
    with store.open(f"sqlite://{tmp_path}/stock.db?tuned=0") as db:
        pragma = lambda name: db.backend.rows(f"PRAGMA {name}")[0][0]
        assert (pragma("journal_mode"), pragma("synchronous")) == ("delete", 2)
    with store.open(f"sqlite://{tmp_path}/full.db", synchronous="full", mmap_mb=0) as db:
        assert db.backend.rows("PRAGMA synchronous")[0][0] == 2 and db.backend.rows("PRAGMA mmap_size")[0][0] == 0


def test_a_parked_sandbox_lets_its_postgresql_connections_go_and_opens_them_again(postgres):
    """sprout.on_park's hook of sprout.store (what a gVisor pod's handler runs before it is
    written to disk): a connection outside a transaction is closed, its server process ends,
    and the next statement opens a new one; one inside a transaction is kept."""
    import sprout.platform as platform

    url = postgres.create_database("parked")
    db = store.open(url)
    counters = db.table(Counter)
    counters.save(Counter("kept", 1))
    pid = db.backend.rows("SELECT pg_backend_pid()")[0][0]
    platform._run_park_hooks()
    assert db.backend._conn is None
    watcher = store.open(url)
    deadline = time.time() + 5
    while watcher.backend.rows("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))[0][0] and time.time() < deadline:
        time.sleep(0.05)
    assert watcher.backend.rows("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))[0][0] == 0
    assert counters.query(counters.fields.name == "kept").first().value == 1
    assert db.backend.rows("SELECT pg_backend_pid()")[0][0] != pid
    with db.transaction():
        platform._run_park_hooks()
        assert db.backend._conn is not None
    db.close()
    watcher.close()
