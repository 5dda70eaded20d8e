"""sprout.store: declare a dataclass, get a typed store (Mirage's storage, for Python).

    from dataclasses import dataclass
    import sprout.store as store

    @dataclass
    class Contact:
        name: str
        mail: str = store.field(index=True)

    db = store.open("sqlite:///contacts.db")          # or "postgresql://user@host/db"
    contacts = db.table(Contact)
    contacts.save(Contact("Anil", "avsm2@cam.ac.uk"))
    cam = contacts.query(contacts.fields.mail.contains("ac.uk")).all()

No SQL is written by the user: for each type the store generates, once, a specialized encoder,
decoder and statements (``codegen``, ``sql``), over SQLite tuned as Mirage's storage was or
over PostgreSQL (``backends``), from the same source.
"""

import contextlib
import itertools
import random
import time
from urllib.parse import parse_qsl, urlsplit

from .backends import PostgresBackend, SQLiteBackend
from .errors import ConflictError, ConnectError, NotFound, QueryError, SchemaError, StoreError, ValidationError
from .model import field, model_of, version
from .query import And, Contains, In, IsNull, Not, Or, Query
from .schema import drop
from .table import Table

__all__ = [
    "open", "Database", "Table", "Query", "field", "version",
    "And", "Or", "Not", "Contains", "In", "IsNull",
    "StoreError", "ConnectError", "SchemaError", "ValidationError", "QueryError", "ConflictError", "NotFound",
]


class Database:
    """An open database: tables by type, transactions, and shortcuts by object."""

    _serial = itertools.count(1)

    def __init__(self, backend, url):
        self.backend = backend
        self.url = url
        self._tables = {}
        # Where objects keep the id of their row in this database (no attribute has this name).
        self.identity_key = f"\x00sprout.store:{next(Database._serial)}"

    def __repr__(self):
        return f"<sprout.store.Database {self.url}>"

    @property
    def engine(self):
        """``"sqlite"`` or ``"postgresql"``."""
        return self.backend.dialect.name

    def table(self, cls):
        """The table of dataclass ``cls``, created (or evolved) on first use."""
        table = self._tables.get(cls)
        if table is None:
            table = self._tables[cls] = Table(self, model_of(cls))
            # Made inside a transaction that rolls back, its table is gone again.
            self.backend.on_rollback(lambda: self._tables.pop(cls, None))
            for f in table.model.fields:
                if f.kind in ("ref", "reflist"):
                    self.table(f.element)  # the tables of referenced types exist up front
        return table

    def transaction(self):
        """``with db.transaction():`` groups writes: all of them are committed, or none."""
        return self.backend.transaction()

    def atomic(self, fn, retries=20):
        """Run ``fn()`` in a transaction, again (up to ``retries`` times) if a concurrent one
        made it conflict; returns what ``fn`` returned. Between tries it sleeps a random
        time under a bound that doubles from 1 ms to 128 ms (jitter keeps writers that
        conflicted together from retrying in step and conflicting again)."""
        for attempt in range(retries + 1):
            try:
                with self.transaction():
                    return fn()
            except ConflictError:
                if attempt == retries:
                    raise
                time.sleep(random.uniform(0, 0.001 * (2 ** min(attempt, 7))))

    def drop(self, cls):
        """Drop the table of dataclass ``cls`` with its rows and link tables (the tables of
        the types it refers to stay); returns whether there was one. The next
        ``table(cls)`` creates it anew, empty, with ids from 1."""
        model = model_of(cls)
        with self.transaction():
            existed = drop(self.backend, model)
        self._tables.pop(cls, None)
        return existed

    @contextlib.contextmanager
    def bulk_load(self, *classes):
        """``with db.bulk_load(A, B):`` for loading many rows of these types: on entry their
        tables' non-unique indexes are dropped, on exit built again, each in one pass (cheaper
        than keeping them up to date row by row). It is one transaction: if the
        block fails, rows and indexes are as they were. Unique indexes stay (they keep
        enforcing uniqueness); until the exit, queries on the other fields scan. The exit
        also gathers the planner's statistics of the tables (ANALYZE): without them a query
        planner guesses, and PostgreSQL's guess for ``WHERE f = ? ORDER BY id LIMIT n`` on a
        freshly loaded table is a walk of the whole primary key."""
        tables = [self.table(cls) for cls in classes]
        dialect = self.backend.dialect
        with self.transaction():
            for table in tables:
                for statement in dialect.drop_indexes(table.model):
                    self.backend.execute(statement)
            yield
            for table in tables:
                for statement in dialect.indexes(table.model):
                    self.backend.execute(statement)
                self.backend.execute(f'ANALYZE "{table.model.table}"')

    def save(self, obj):
        return self.table(type(obj)).save(obj)

    def get(self, cls, rowid):
        return self.table(cls).get(rowid)

    def query(self, cls, where=None):
        return self.table(cls).query(where)

    def delete(self, obj):
        return self.table(type(obj)).delete(obj)

    def close(self):
        self.backend.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _with_service_address(url):
    """`url` with a service's name (and no port) replaced by the service's address and port."""
    from sprout.platform import services

    parts = urlsplit(url)
    known = services()
    if parts.port is not None or not parts.hostname or parts.hostname not in known:
        return url
    userinfo, at, _ = parts.netloc.rpartition("@")
    return parts._replace(netloc=f"{userinfo}{at}{known[parts.hostname]}").geturl()


def open(url, **options):
    """Open a database by URL:

    * ``sqlite:///absolute/path.db``, ``sqlite:relative/path.db``, ``sqlite::memory:``, with
      tuning options as query parameters (see ``backends``) or keyword arguments;
    * ``postgresql://user:password@host:port/dbname`` (libpq's URL), through psycopg 3. In a
      sandbox, a host that names one of its services (``sprout.services()``) and no port
      takes the service's address and port: ``postgresql://olio@postgres/olio``.
    """
    if not isinstance(url, str):
        raise ConnectError(f"a database URL is a str, not {type(url).__name__}")
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        rest = url[len("sqlite:"):]
        path, _, query = rest.partition("?")
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise ConnectError(f"{url!r} names no file: write sqlite:///path/to/file.db (or sqlite::memory:)")
        opts = dict(parse_qsl(query))
        opts.update({k: str(int(v) if isinstance(v, bool) else v) for k, v in options.items()})
        return Database(SQLiteBackend(path, opts), url)
    if scheme in ("postgresql", "postgres"):
        url = _with_service_address(url)
        parts = urlsplit(url)
        opts = {k: str(v) for k, v in options.items()}
        return Database(PostgresBackend(url, opts), f"{parts.scheme}://{parts.hostname or ''}{parts.path}")
    raise ConnectError(f"unknown database {url!r}: use sqlite:///path or postgresql://...")
