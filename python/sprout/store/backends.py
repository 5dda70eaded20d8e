"""Connections to the two engines, and how each is tuned and runs transactions.

**SQLite** (the embedded default) is tuned as Mirage's storage layer was; each setting is an
option of the URL (``sqlite:///path?synchronous=full``) and ``tuned=0`` restores SQLite's own
defaults:

=================  =========  ================================================================
option             default    what it does
=================  =========  ================================================================
``journal``        ``wal``    write-ahead log: a commit appends pages instead of copying the
                              old ones to a rollback journal; readers never block the writer
``synchronous``    ``normal`` with WAL, fsync at checkpoints rather than at every commit: a
                              power cut may lose the last commits, never consistency
``page_size``      ``4096``   4 KiB pages, matching the file system and the memory page (set
                              when the database is created)
``mmap_mb``        ``256``    reads through a memory-mapped window instead of read() copies
``cache_mb``       ``64``     the page cache
``busy_timeout_ms`` ``10000`` how long a writer waits for another process's write lock
=================  =========  ================================================================

Statements are prepared once and kept (``cached_statements``), and text, blob and JSON
columns come last in every row (see ``model``). Writes outside ``transaction()`` commit one
statement at a time; ``transaction()`` takes the write lock at its start (``BEGIN
IMMEDIATE``), so transactions of several processes run one after another and a
read-modify-write inside one never loses an update.

**PostgreSQL** goes through psycopg 3 in autocommit mode, with statements prepared after
their first use, and batches of new rows (``save_many``) sent with one ``COPY``, their ids
reserved from the table's sequence first; ``transaction()`` runs at SERIALIZABLE isolation,
where a conflicting concurrent transaction makes the commit fail with :class:`ConflictError`
(``Database.atomic`` retries a function on it). When its sandbox is parked
(``sprout.on_park``), a PostgreSQL connection outside a transaction is let go, and opened
again by the next statement.
"""

import contextlib
import os
import sqlite3
import time
import weakref

from sprout.platform import on_park

from .errors import ConflictError, ConnectError, StoreError
from .sql import PostgresDialect, SQLiteDialect

SQLITE_DEFAULTS = {"journal": "wal", "synchronous": "normal", "page_size": "4096", "mmap_mb": "256",
                   "cache_mb": "64", "busy_timeout_ms": "10000", "tuned": "1"}


class SQLiteBackend:
    dialect = SQLiteDialect()

    def __init__(self, path, options):
        unknown = set(options) - set(SQLITE_DEFAULTS)
        if unknown:
            raise ConnectError(f"unknown SQLite options {sorted(unknown)}; the options are {sorted(SQLITE_DEFAULTS)}")
        self.options = {**SQLITE_DEFAULTS, **options}
        self.path = path
        try:
            timeout = int(self.options["busy_timeout_ms"]) / 1000
        except ValueError:
            raise ConnectError(f"busy_timeout_ms must be a number of milliseconds, not {self.options['busy_timeout_ms']!r}") from None
        if path != ":memory:":
            parent = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(parent):
                raise ConnectError(f"cannot open {path}: directory {parent} does not exist")
        try:
            self.conn = sqlite3.connect(path, timeout=timeout, isolation_level=None, cached_statements=512)
            deadline = time.monotonic() + timeout
            self._while_locked(deadline, "PRAGMA schema_version")  # reads the header: is it a database?
            if self.options["tuned"] not in ("0", "false", "no"):
                self._tune(deadline)
        except sqlite3.DatabaseError as e:
            raise ConnectError(f"cannot open {path} as an SQLite database: {e}") from None
        self.depth = 0
        self.undo = []

    def _while_locked(self, deadline, sql):
        """Run a statement, retrying while the database is locked, until the deadline. Opening
        a fresh database that other processes are opening (and switching to WAL) can fail at
        once with "locked": SQLite skips its busy handler there to rule out a deadlock."""
        while True:
            try:
                return self.conn.execute(sql).fetchall()
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    def _tune(self, deadline):
        o = self.options
        pragmas = [
            ("page_size", int(o["page_size"])),  # only before the first table exists
            ("journal_mode", o["journal"].upper()),
            ("synchronous", o["synchronous"].upper()),
            ("mmap_size", int(o["mmap_mb"]) << 20),
            ("cache_size", -(int(o["cache_mb"]) << 10)),
            ("temp_store", "MEMORY"),
        ]
        for name, value in pragmas:
            self._while_locked(deadline, f"PRAGMA {name} = {value}")

    def execute(self, sql, params=()):
        try:
            return self.conn.execute(sql, params)
        except sqlite3.OperationalError as e:
            raise _explain(e) from None

    def executemany(self, sql, rows):
        try:
            return self.conn.executemany(sql, rows)
        except sqlite3.OperationalError as e:
            raise _explain(e) from None

    def rows(self, sql, params=()):
        return self.execute(sql, params).fetchall()

    def insert(self, sql, params):
        return self.execute(sql, params).lastrowid

    @contextlib.contextmanager
    def transaction(self):
        if self.depth == 0:
            self.execute("BEGIN IMMEDIATE")
            commit, rollback = "COMMIT", "ROLLBACK"
        else:
            name = f"sprout_{self.depth}"
            self.execute(f"SAVEPOINT {name}")
            commit, rollback = f"RELEASE {name}", f"ROLLBACK TO {name}; RELEASE {name}"
        self.depth += 1
        self.undo.append([])
        try:
            yield
        except BaseException:
            self.depth -= 1
            for statement in rollback.split("; "):
                self.conn.execute(statement)
            _run_undo(self.undo.pop())
            raise
        self.depth -= 1
        self.execute(commit)
        _keep_undo(self.undo)

    def on_rollback(self, fn):
        """Call ``fn`` if the current transaction (or savepoint) rolls back."""
        if self.undo:
            self.undo[-1].append(fn)

    def in_transaction(self):
        return self.depth > 0

    def close(self):
        self.conn.close()


def _run_undo(callbacks):
    for fn in reversed(callbacks):
        fn()


def _keep_undo(stack):
    """A committed level's undo callbacks belong to the level around it (gone at the top)."""
    done = stack.pop()
    if stack:
        stack[-1].extend(done)


def _explain(e):
    message = str(e)
    if "locked" in message or "busy" in message:
        return StoreError(f"the database is locked: another process held its write lock past busy_timeout_ms ({message})")
    return StoreError(message)


class PostgresBackend:
    dialect = PostgresDialect()

    def __init__(self, url, options):
        try:
            import psycopg
        except ImportError:
            raise ConnectError("PostgreSQL needs psycopg 3: pip install 'psycopg[binary]'") from None
        self.psycopg = psycopg
        self.url, self.options = url, options
        self.timeout = int(options.pop("connect_timeout", "5"))
        self._conn = self._connect()
        self.depth = 0
        self.undo = []
        _PARKABLE.add(self)

    def _connect(self):
        try:
            return self.psycopg.connect(self.url, autocommit=True, prepare_threshold=1, connect_timeout=self.timeout, **self.options)
        except self.psycopg.OperationalError as e:
            raise ConnectError(f"cannot connect to PostgreSQL ({_where(self.url)}): {str(e).strip().splitlines()[0]}") from None

    @property
    def conn(self):
        """The connection, opened again if it was let go while the sandbox was parked."""
        if self._conn is None:
            self._conn = self._connect()
        return self._conn

    def park(self):
        """Let the connection go while no transaction is open (the sandbox is being parked:
        a parked site holds no server process); the next statement opens a new one."""
        if self._conn is not None and self.depth == 0:
            self._conn.close()
            self._conn = None

    def execute(self, sql, params=()):
        try:
            return self.conn.execute(sql, params)
        except self.psycopg.errors.SerializationFailure as e:
            raise ConflictError(f"a concurrent transaction changed the same rows: retry ({e})") from None
        except self.psycopg.OperationalError as e:
            raise StoreError(f"PostgreSQL: {str(e).strip()}") from None

    def executemany(self, sql, rows):
        with self.conn.cursor() as cur:
            cur.executemany(sql, rows)

    def rows(self, sql, params=()):
        return self.execute(sql, params).fetchall()

    def insert(self, sql, params):
        return self.execute(sql, params).fetchone()[0]

    def copy(self, sql, rows):
        """Send ``rows`` (tuples) through ``COPY ... FROM STDIN``."""
        try:
            with self.conn.cursor() as cur, cur.copy(sql) as copy:
                for row in rows:
                    copy.write_row(row)
        except self.psycopg.errors.SerializationFailure as e:
            raise ConflictError(f"a concurrent transaction changed the same rows: retry ({e})") from None
        except self.psycopg.OperationalError as e:
            raise StoreError(f"PostgreSQL: {str(e).strip()}") from None

    @contextlib.contextmanager
    def transaction(self):
        outer = self.depth == 0
        self.depth += 1
        self.undo.append([])
        committed = False
        try:
            with self.conn.transaction():
                if outer:
                    self.conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                yield
            committed = True
        except self.psycopg.errors.SerializationFailure as e:
            raise ConflictError(f"a concurrent transaction changed the same rows: retry ({e})") from None
        finally:
            self.depth -= 1
            if committed:
                _keep_undo(self.undo)
            else:
                _run_undo(self.undo.pop())

    def on_rollback(self, fn):
        """Call ``fn`` if the current transaction (or savepoint) rolls back."""
        if self.undo:
            self.undo[-1].append(fn)

    def in_transaction(self):
        return self.depth > 0

    def close(self):
        if self._conn is not None:
            self._conn.close()
        _PARKABLE.discard(self)


# PostgreSQL connections let go when their sandbox is parked (sprout.on_park).
_PARKABLE = weakref.WeakSet()


@on_park
def _park_connections():
    for backend in list(_PARKABLE):
        backend.park()


def _where(url):
    from urllib.parse import urlparse

    u = urlparse(url)
    return f"{u.hostname or 'local socket'}:{u.port or 5432}/{u.path.lstrip('/')}"
