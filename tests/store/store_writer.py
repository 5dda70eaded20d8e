"""A separate process writing a sprout.store database, for tests of concurrency and crashes.

    store_writer.py counter URL N           add 1 to the shared counter N times, each a
                                            read-modify-write in db.atomic()
    store_writer.py versioned URL N         the same without a transaction, relying on the
                                            version field (retrying on ConflictError)
    store_writer.py batches URL             forever: a transaction adding a batch of 20 rows
                                            and counting the batch in the ledger
"""

import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import sprout.store as store  # noqa: E402


@dataclasses.dataclass
class Counter:
    name: str
    value: int = 0
    version: int = store.version()


@dataclasses.dataclass
class Row:
    batch: int
    payload: bytes


@dataclasses.dataclass
class Ledger:
    batches: int = 0


def counter(db, n):
    table = db.table(Counter)
    f = table.fields
    for _ in range(n):
        def bump():
            c = table.query(f.name == "shared").first()
            c.value += 1
            table.save(c)
        db.atomic(bump)


def versioned(db, n):
    table = db.table(Counter)
    f = table.fields
    done = 0
    while done < n:
        c = table.query(f.name == "shared").first()
        c.value += 1
        try:
            table.save(c)
            done += 1
        except store.ConflictError:
            pass


def batches(db):
    rows, ledgers = db.table(Row), db.table(Ledger)
    ledger = ledgers.all()[0]
    print("ready", flush=True)
    while True:
        with db.transaction():
            ledger.batches += 1
            for _ in range(20):
                rows.save(Row(ledger.batches, os.urandom(512)))
            ledgers.save(ledger)


if __name__ == "__main__":
    mode, url = sys.argv[1], sys.argv[2]
    database = store.open(url)
    if mode == "counter":
        counter(database, int(sys.argv[3]))
    elif mode == "versioned":
        versioned(database, int(sys.argv[3]))
    else:
        batches(database)
