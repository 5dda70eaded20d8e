"""The Olio loader on real SQLite and a real PostgreSQL: olio-spec.md's loader rules (ratios,
ranges, consistency of the denormalized fields), determinism (same seed and day, same rows
and files byte for byte, on both engines), Cloudstone's U >= 3 rule, refusing to load twice,
--recreate, a failed load leaving the database as it was, and the files it writes decoding."""

import hashlib
import html
import math
import os
import pty
import sqlite3
import subprocess
import sys
from collections import Counter, defaultdict
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "apps" / "olio"))

import sprout.store as store  # noqa: E402
from olio import loader, loader_rows  # noqa: E402
from olio.models import ALL, Address, Document, Event, Image, User  # noqa: E402

TODAY = date(2025, 3, 1)
MIDNIGHT = datetime(2025, 3, 1)
USERS = 1000  # the smallest valid Cloudstone scale: 250 tags, 750 events
SEED = 7


def run_loader(*args, stderr=subprocess.PIPE):
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'python'}:{ROOT / 'apps' / 'olio'}"}
    env.pop("OLIO_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "olio.loader", *map(str, args)], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=300)


def snapshot(url):
    """{type name: [(id, object)]} of every Olio table, as the app reads them."""
    with store.open(url) as db:
        out = {}
        for cls in ALL:
            table = db.table(cls)
            out[cls.__name__] = sorted(((table.id_of(o), o) for o in table.all()), key=lambda pair: pair[0])
        return out


def sqlite_bytes(path):
    """Every table's rows exactly as SQLite stores them, schema included."""
    conn = sqlite3.connect(path)
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    out = {"schema": conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()}
    for name in names:
        out[name] = conn.execute(f'SELECT * FROM "{name}" ORDER BY rowid').fetchall()
    conn.close()
    return out


def file_bytes(files):
    return {p.name: p.read_bytes() for p in sorted((Path(files) / "loader").iterdir())}


class Loaded:
    def __init__(self, url, files, summary):
        self.url, self.files, self.summary = url, Path(files), summary
        self.rows = snapshot(url)

    def objects(self, cls):
        return [o for _, o in self.rows[cls.__name__]]


@pytest.fixture(scope="module")
def loaded_sqlite(tmp_path_factory):
    d = tmp_path_factory.mktemp("olio-sqlite")
    url = f"sqlite://{d}/olio.db"
    return Loaded(url, d / "files", loader.load(url, str(d / "files"), USERS, SEED, TODAY))


@pytest.fixture(scope="module")
def loaded_postgres(tmp_path_factory, postgres):
    d = tmp_path_factory.mktemp("olio-postgres")
    url = postgres.create_database("olio_loader")
    return Loaded(url, d / "files", loader.load(url, str(d / "files"), USERS, SEED, TODAY))


@pytest.fixture(params=["sqlite", "postgres"])
def loaded(request):
    return request.getfixturevalue(f"loaded_{request.param}")


# ---------------------------------------------------------------------- the rules


def test_the_scale_formulas():
    def spec(u):  # olio-spec.md's formula, rounded as Java's Math.round
        x = math.exp(-u / 10000)
        return int(5000 * (1 - x) / (1 + x) + 0.5)

    for users in (10, 100, 1000, 2500, 10000, 12345, 100000, 10 ** 6):
        assert loader_rows.tag_count(users) == spec(users)
        assert loader_rows.event_count(users) == 3 * spec(users)
    assert [loader_rows.tag_count(u) for u in (1000, 10000, 100000, 10 ** 6)] == [250, 2311, 5000, 5000]


def test_every_table_holds_what_the_scale_gives(loaded):
    tags, events = 250, 750
    counts = {name: len(rows) for name, rows in loaded.rows.items()}
    assert counts["User"] == USERS and counts["Tag"] == tags and counts["Event"] == events
    # One address and one image row per user and per event, one document per event.
    assert counts["Address"] == counts["Image"] == USERS + events and counts["Document"] == events
    assert loaded.summary["tables"] == counts
    for name, rows in loaded.rows.items():
        assert [rowid for rowid, _ in rows] == list(range(1, len(rows) + 1)), f"{name}: ids are not 1..n"


def test_users_are_named_by_id_with_their_id_as_password(loaded):
    users = loaded.rows["User"]
    with store.open(loaded.url) as db:
        # Rows of their own (the files are shared): ids as this connection loaded them.
        read = db.table(User).all()
        address_rows = {db.table(Address).id_of(u.address) for u in read}
        image_rows = {db.table(Image).id_of(u.image) for u in read}
        for i, user in users:
            assert user.username == f"user{i}" == loader_rows.username(i)
            salt, digest = user.password.split("$")
            assert len(salt) == 16 and digest == hashlib.sha256((salt + str(i)).encode()).hexdigest()
            assert MIDNIGHT - timedelta(days=540) <= user.created_at < MIDNIGHT
            assert user.firstname and user.lastname and user.email == f"user{i}@example.com"
            assert user.address is not None and user.image is not None
    assert len(address_rows) == len(image_rows) == USERS and None not in address_rows | image_rows
    assert len({u.password.split("$")[0] for _, u in users}) == USERS  # a salt per user


def test_friends_are_2_to_28_accepted_invites_read_both_ways(loaded):
    friends = defaultdict(set)
    for _, invite in loaded.rows["Invite"]:
        assert invite.is_accepted and invite.user_id != invite.target_id
        assert invite.target_id not in friends[invite.user_id], "a friendship stored twice"
        friends[invite.user_id].add(invite.target_id)
        friends[invite.target_id].add(invite.user_id)
    degrees = [len(friends[u]) for u in range(1, USERS + 1)]
    assert min(degrees) >= 2 and max(degrees) <= 28
    assert 12 <= sum(degrees) / USERS <= 16  # targets are uniform over 2..28 (mean 15)


def test_events_follow_the_rules(loaded):
    for _, e in loaded.rows["Event"]:
        assert 20 <= len(e.title) <= 100 and 500 <= len(e.summary) <= 1024 and 1024 <= len(e.description) <= 4096
        assert TODAY <= e.event_date <= TODAY + timedelta(days=540)
        assert e.event_timestamp.date() == e.event_date
        assert 7 <= e.event_timestamp.hour <= 21 and e.event_timestamp.minute in (0, 15, 30, 45)
        assert MIDNIGHT - timedelta(days=540) <= e.created_at < MIDNIGHT
        assert e.zip == e.address.zip and len(e.zip) == 5
        assert 1 <= e.user_id <= USERS and not e.disabled
        assert e.image.content_type == "image/jpeg" and e.document.content_type == "application/pdf"
    days = {e.event_date for e in loaded.objects(Event)}
    assert len(days) > 300  # spread over the 541 days, not bunched


def test_tags_per_event_refcounts_and_popularity(loaded):
    tags = loaded.rows["Tag"]
    assert [t.name for _, t in tags] == [f"tag{i}" for i in range(1, 251)]
    per_event = defaultdict(list)
    for _, tagging in loaded.rows["Tagging"]:
        per_event[tagging.event_id].append(tagging.tag_id)
    assert set(per_event) == set(range(1, 751))
    for tag_ids in per_event.values():
        assert 1 <= len(tag_ids) <= 7 and len(set(tag_ids)) == len(tag_ids)
    uses = Counter(t for ids in per_event.values() for t in ids)
    assert all(t.refcount == uses[i] for i, t in tags)
    # A negative exponential of mean 0.1 x 250 over the rank: mean rank near 25, 1 - 1/e of
    # the uses on the first 25 tags, e^-5 past rank 125; tag 1 among the most used.
    ranks = [t - 1 for ids in per_event.values() for t in ids]
    assert 20 <= sum(ranks) / len(ranks) <= 30
    assert 0.55 <= sum(r < 25 for r in ranks) / len(ranks) <= 0.70
    assert sum(r >= 125 for r in ranks) / len(ranks) <= 0.015
    assert uses[1] >= sorted(uses.values())[-3]


def test_attendees_are_10_to_100_distinct_users(loaded):
    per_event = defaultdict(list)
    for _, a in loaded.rows["Attendance"]:
        per_event[a.event_id].append(a.user_id)
    assert set(per_event) == set(range(1, 751))
    for users in per_event.values():
        assert 10 <= len(users) <= 100 and len(set(users)) == len(users)
        assert all(1 <= u <= USERS for u in users)


def test_comments_ratings_and_scores_agree(loaded):
    events = dict(loaded.rows["Event"])
    per_event = defaultdict(list)
    for _, c in loaded.rows["Comment"]:
        per_event[c.event_id].append(c)
        assert 250 <= len(c.comment) <= 1024 and 2 <= c.rating <= 5 and 1 <= c.user_id <= USERS
        assert events[c.event_id].created_at < c.created_at <= MIDNIGHT and c.updated_at == c.created_at
    for event_id, event in events.items():
        comments = per_event.get(event_id, [])
        assert len(comments) <= 20
        assert event.num_votes == len(comments) and event.total_score == sum(c.rating for c in comments)
    assert any(not per_event.get(i) for i in events) and any(len(c) == 20 for c in per_event.values())


def test_images_and_documents_are_real_files_true_to_their_rows(loaded):
    from PIL import Image as Picture
    from pypdf import PdfReader

    images = {(i.filename, i.size, i.width, i.height, i.thumbnail) for i in loaded.objects(Image)}
    assert 10 <= len({i[0] for i in images}) <= 20  # rows per user/event share the set's files
    for filename, size, width, height, thumbnail in images:
        path = loaded.files / filename
        assert filename.startswith("loader/") and path.stat().st_size == size
        with Picture.open(path) as picture:
            assert picture.format == "JPEG" and picture.size == (width, height)
            picture.load()
        with Picture.open(loaded.files / thumbnail) as thumb:
            thumb.load()
            assert thumb.width <= 120 and thumb.height <= 120 and thumb.width < width
        assert filename.removeprefix("loader/").removesuffix(".jpg") == hashlib.sha256(path.read_bytes()).hexdigest()[:32]
    documents = {(d.filename, d.size) for d in loaded.objects(Document)}
    assert len(documents) >= 2
    for filename, size in documents:
        data = (loaded.files / filename).read_bytes()
        assert data.startswith(b"%PDF-") and len(data) == size
        reader = PdfReader(loaded.files / filename, strict=True)
        assert len(reader.pages) == 1 and "Olio event document" in reader.pages[0].extract_text()


# ---------------------------------------------------------------------- determinism


def test_the_same_seed_and_day_give_the_same_bytes(loaded_sqlite, tmp_path):
    url = f"sqlite://{tmp_path}/again.db"
    loader.load(url, str(tmp_path / "files"), USERS, SEED, TODAY)
    assert sqlite_bytes(f"{tmp_path}/again.db") == sqlite_bytes(loaded_sqlite.url.removeprefix("sqlite://"))
    assert file_bytes(tmp_path / "files") == file_bytes(loaded_sqlite.files)


def test_both_engines_hold_the_same_rows(loaded_sqlite, loaded_postgres):
    assert loaded_postgres.rows == loaded_sqlite.rows


def test_another_seed_or_day_gives_other_rows(tmp_path):
    def small(name, seed, today):
        url = f"sqlite://{tmp_path}/{name}.db"
        loader.load(url, str(tmp_path / "files"), 100, seed, today)
        return snapshot(url)

    one, other_seed, other_day = small("a", 1, TODAY), small("b", 2, TODAY), small("c", 1, TODAY + timedelta(days=1))
    for name in ("User", "Event", "Comment", "Attendance", "Invite", "Tagging"):
        assert one[name] != other_seed[name], name
    # Another reference day moves every date by one day and changes nothing else.
    shifted = [(i, e.event_date - timedelta(days=1), e.created_at - timedelta(days=1)) for i, e in other_day["Event"]]
    assert shifted == [(i, e.event_date, e.created_at) for i, e in one["Event"]]
    assert [u.password for _, u in other_day["User"]] == [u.password for _, u in one["User"]]


# ---------------------------------------------------------------------- the command


def test_fewer_than_1000_users_are_refused_unless_allowed(tmp_path):
    db = tmp_path / "olio.db"
    out = run_loader("--users", 999, "--db", f"sqlite://{db}", "--files", tmp_path / "files")
    assert out.returncode == 2 and "U = log10(999) = 2.9996 < 3" in out.stderr and "--allow-small" in out.stderr
    assert not db.exists() and not (tmp_path / "files").exists()
    out = run_loader("--concurrent", 24, "--db", f"sqlite://{db}", "--files", tmp_path / "files")
    assert out.returncode == 2 and "at least 25 concurrent users" in out.stderr
    out = run_loader("--users", 5, "--allow-small", "--db", f"sqlite://{db}", "--files", tmp_path / "files")
    assert out.returncode == 2 and "too few" in out.stderr
    out = run_loader("--users", 10, "--concurrent", 1, "--db", f"sqlite://{db}")
    assert out.returncode == 2 and "not allowed with" in out.stderr

    out = run_loader("--concurrent", 1, "--allow-small", "--seed", 3, "--db", f"sqlite://{db}",
                     "--files", tmp_path / "files", "--today", "2025-03-01")
    assert out.returncode == 0, out.stderr
    assert "100 users" in out.stdout and "NOT VALID for Cloudstone" in out.stdout
    assert len(snapshot(f"sqlite://{db}")["User"]) == 100


def test_a_second_load_is_refused_and_recreate_replaces_it(tmp_path):
    url, files = f"sqlite://{tmp_path}/olio.db", tmp_path / "files"
    common = ["--users", 100, "--allow-small", "--db", url, "--files", files, "--today", "2025-03-01"]
    first = run_loader(*common, "--seed", 1)
    assert first.returncode == 0, first.stderr
    # Not a terminal: a line per table on stderr.
    for table in ("tags", "users", "invites", "events", "taggings", "attendances", "comments"):
        assert any(line.startswith(table) and " rows in " in line for line in first.stderr.splitlines()), table
    before = snapshot(url)

    (files / "loader" / "stale.jpg").write_bytes(b"from an older loader")
    (files / "upload.jpg").write_bytes(b"the app's")
    again = run_loader(*common, "--seed", 1)
    assert again.returncode == 2 and "already holds Olio data" in again.stderr and "--recreate" in again.stderr
    assert snapshot(url) == before and (files / "loader" / "stale.jpg").exists()

    recreated = run_loader(*common, "--seed", 2, "--recreate", "--quiet")
    assert recreated.returncode == 0 and recreated.stderr == ""
    assert "1 stale ones removed" in recreated.stdout
    fresh = f"sqlite://{tmp_path}/fresh.db"
    assert run_loader(*common[:3], "--db", fresh, "--files", files, "--today", "2025-03-01", "--seed", 2).returncode == 0
    assert snapshot(url) == snapshot(fresh) != before  # ids from 1 again, nothing duplicated
    assert not (files / "loader" / "stale.jpg").exists() and (files / "upload.jpg").read_bytes() == b"the app's"


def test_a_failed_recreate_leaves_the_old_data(store_url, tmp_path):
    files = str(tmp_path / "files")
    loader.load(store_url, files, 60, 1, TODAY)
    before = snapshot(store_url)

    class FailsAtEvents(loader.Progress):
        def table(self, name, total, unit="rows"):
            if name == "events":
                raise RuntimeError("the disk is full")
            return super().table(name, total, unit)

    with pytest.raises(RuntimeError, match="disk is full"):
        loader.load(store_url, files, 80, 2, TODAY, recreate=True, progress=FailsAtEvents(quiet=True))
    assert snapshot(store_url) == before
    loader.load(store_url, files, 80, 2, TODAY, recreate=True)
    assert len(snapshot(store_url)["User"]) == 80


def test_a_terminal_gets_a_progress_bar(tmp_path):
    main, terminal = pty.openpty()
    out = run_loader("--users", 60, "--allow-small", "--db", f"sqlite://{tmp_path}/olio.db",
                     "--files", tmp_path / "files", stderr=terminal)
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal's other end is closed
            break
        if not chunk:
            break
        shown += chunk
    os.close(main)
    assert out.returncode == 0
    assert b"\rusers" in shown and b"\rcomments" in shown and b"rows/s" in shown


def test_an_unusable_file_store_or_database_fails_cleanly(tmp_path, postgres):
    (tmp_path / "a-file").write_text("not a directory")
    db = tmp_path / "olio.db"
    out = run_loader("--users", 60, "--allow-small", "--db", f"sqlite://{db}", "--files", tmp_path / "a-file" / "files")
    assert out.returncode == 1 and "cannot write the file store" in out.stderr and "Traceback" not in out.stderr
    assert sqlite_bytes(db) == {"schema": []}  # no table was left
    out = run_loader("--users", 60, "--allow-small", "--db", f"postgresql://postgres@127.0.0.1:{postgres.port}/no_such_db",
                     "--files", tmp_path / "files")
    assert out.returncode == 1 and "no_such_db" in out.stderr and "nothing was loaded" in out.stderr


# ---------------------------------------------------------------------- the app reads it


def test_the_app_serves_the_loaded_data(tmp_path):
    """gunicorn serving olio.wsgi:app over a loaded database: events on the home page and by
    tag, their pictures, loaded users logging in with their id as password, friendships
    seen from both ends."""
    from olio_fixtures import Browser, Gunicorn, event_ids

    url, files = f"sqlite://{tmp_path}/olio.db", tmp_path / "files"
    loader.load(url, str(files), 100, SEED, datetime.now(UTC).date())
    rows = snapshot(url)
    server = Gunicorn(url, files).start()
    try:
        site = Browser(server.url)
        home = site.get("/")
        shown = event_ids(home.text)
        assert home.status_code == 200 and len(shown) == 10 and "tag1" in home.text
        event = dict(rows["Event"])[shown[0]]
        page = site.get(f"/events/{shown[0]}")
        assert page.status_code == 200 and html.escape(event.title) in page.text
        picture = site.get(f"/files/{event.image.filename}")
        assert picture.status_code == 200 and picture.content == (files / event.image.filename).read_bytes()
        assert event_ids(site.get("/events/tag_search?tag=tag1").text)

        a, b = next((i.user_id, i.target_id) for _, i in rows["Invite"])
        assert site.post("/users/login", data={"username": f"user{a}", "password": str(a + 1)}).status_code != 303
        site.login(f"user{a}", str(a))
        assert "You are friends." in site.get(f"/users/{b}").text
        site.logout()
        site.login(f"user{b}", str(b))
        assert "You are friends." in site.get(f"/users/{a}").text
    finally:
        server.stop()
