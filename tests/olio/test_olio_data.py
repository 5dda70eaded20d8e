"""Olio's data access under several processes, on real SQLite and PostgreSQL: processes
racing to create the tables of a fresh database all succeed, and a process forked after its
parent used the database (as gunicorn workers and Sprout sandboxes are) opens its own
connection and leaves the parent's working; a site whose database connection is cut fails
one request with a 503 page and reconnects."""

import multiprocessing
import sys

import psycopg

from olio_fixtures import APP_PATH, Browser, Gunicorn

sys.path[:0] = [p for p in APP_PATH.split(":") if p not in sys.path]

from olio import data  # noqa: E402

FORK = multiprocessing.get_context("fork")


def _open_and_count(url, queue):
    try:
        data.configure(url)
        queue.put(data.attendee_count(1))
    except Exception as e:  # reported to the test, which shows it
        queue.put(repr(e))


def test_processes_racing_on_a_fresh_database_all_open_it(store_url):
    # Rounds of 12 racers: SQLite's switch to WAL could refuse a racer at once ("database
    # is locked") about once in a hundred opens before the store retried it.
    for attempt in range(4):
        url = store_url.replace("store.db", f"race{attempt}.db") if store_url.startswith("sqlite") else store_url
        queue = FORK.Queue()
        racers = [FORK.Process(target=_open_and_count, args=(url, queue)) for _ in range(12)]
        for racer in racers:
            racer.start()
        answers = [queue.get(timeout=60) for _ in racers]
        for racer in racers:
            racer.join(timeout=30)
        assert answers == [0] * len(racers)


def _child_uses_the_database(queue):
    queue.put((data.db() is not PARENT_DB, data.username_taken("nobody")))


def test_a_forked_process_opens_its_own_connection(store_url):
    global PARENT_DB
    data.configure(store_url)
    PARENT_DB = data.db()
    assert data.db() is PARENT_DB  # one per thread and process
    queue = FORK.Queue()
    child = FORK.Process(target=_child_uses_the_database, args=(queue,))
    child.start()
    assert queue.get(timeout=60) == (True, False)
    child.join(timeout=30)
    assert child.exitcode == 0
    assert data.db() is PARENT_DB and data.username_taken("nobody") is False  # still connected
    data.forget_connection()


def test_a_lost_database_connection_costs_one_503_then_reconnects(postgres, tmp_path):
    url = postgres.create_database("olio_lost_connection")
    server = Gunicorn(url, tmp_path / "files", workers=1).start()
    try:
        browser = Browser(server.url)
        user_id, _ = browser.register()
        with psycopg.connect(postgres.url("postgres"), autocommit=True) as admin:
            killed = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                   "WHERE datname = 'olio_lost_connection'").fetchall()
        assert killed  # the worker's connection was there, and is gone
        first = browser.get(f"/users/{user_id}")
        assert first.status_code == 503 and "The database is unavailable; please try again." in first.text
        assert "This is you." in browser.get(f"/users/{user_id}").text  # a new connection
        assert browser.add_event(image=False, document=False)
    finally:
        server.stop()
