"""Olio against bad requests, through a real server on each stack: unknown ids, logged-out
actions, HTML and SQL injection in every field, uploads and paths trying to leave the file
store, oversized requests, and the cookie-signing key kept in the file store."""

import http.client
import re

import pytest

from olio_fixtures import PDF, Browser, Gunicorn, event_fields, picture, unique, user_fields

SCRIPT = "<script>alert(1)</script>"


def test_unknown_ids_and_paths_are_404_pages(olio_site):
    b = olio_site.browser()
    for path in ("/events/99999999", "/users/99999999", "/no/such/page", "/events/abc", "/users/-1",
                 "/events/99999999/comments/1/edit"):
        r = b.get(path)
        assert r.status_code in (404, 303), path  # the edit form asks a logged-out user to log in first
    b.register()
    for path in ("/events/99999999", "/users/99999999", "/events/99999999/comments/1/edit"):
        r = b.get(path)
        assert r.status_code == 404 and "There is no such page." in r.text and "<h1>Not found</h1>" in r.text, path
    assert b.get("/events/99999999", headers={"X-Requested-With": "XMLHttpRequest"}).json() == {"error": "There is no such page."}
    assert b.post("/users/99999999/approve").status_code == 404


LOGGED_OUT_POSTS = ["/events", "/events/1/attend", "/events/1/unattend", "/events/1/comments",
                    "/events/1/comments/1/edit", "/events/1/comments/1/delete",
                    "/users/1/invite", "/users/1/approve", "/users/1/reject", "/users/1/revoke"]


def test_logged_out_posts_go_to_the_login_page_and_change_nothing(olio_site):
    owner = olio_site.browser()
    owner.register()
    event_id = owner.add_event(image=False, document=False)
    page = owner.get(f"/events/{event_id}").text
    anonymous = olio_site.browser()
    for path in [p.replace("/1/", f"/{event_id}/", 1) for p in LOGGED_OUT_POSTS]:
        r = anonymous.post(path, data={"rating": "5", "comment": "sneaky", **event_fields()})
        assert r.status_code == 303 and "/users/login" in r.headers["Location"], path
        ajax = anonymous.post(path, ajax=True)
        assert ajax.status_code == 401 and ajax.json()["login"] == "/users/login", path
    r = anonymous.get("/events/new")
    assert r.status_code == 303 and r.headers["Location"].endswith("/users/login?next=/events/new")
    assert owner.get(f"/events/{event_id}").text == page


def test_html_in_every_text_field_comes_back_escaped(olio_site):
    b = olio_site.browser()
    fields = user_fields(unique(), **{k: SCRIPT for k in ("firstname", "lastname", "summary", "street1",
                                                          "street2", "city", "state", "country")})
    user_id, _ = b.register(**{k: v for k, v in fields.items() if k != "username"})
    event_id = b.add_event(**{k: SCRIPT for k in ("title", "summary", "description", "street1", "street2",
                                                  "city", "state", "country")})
    b.post(f"/events/{event_id}/comments", data={"rating": "3", "comment": SCRIPT})
    pages = [b.get(f"/users/{user_id}").text, b.get(f"/events/{event_id}").text, b.get("/?order=created_at").text]
    for page in pages:
        assert "<script>alert" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    event_page = pages[1]
    assert event_page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 8  # title, summary, description, address, comment
    refused = b.post("/events", data=event_fields(tags=SCRIPT, title='"><img src=x onerror=alert(1)>'))
    assert refused.status_code == 422 and "<img src=x" not in refused.text and "&#34;&gt;&lt;img src=x" in refused.text
    lookup = b.get("/events/tag_search", params={"tag": SCRIPT})
    assert lookup.status_code == 200 and "<script>alert" not in lookup.text


def test_sql_in_inputs_is_just_text(olio_site):
    b = olio_site.browser()
    _, name = b.register()
    for attempt in ("' OR '1'='1", f"{name}' --", "x\"; DROP TABLE user; --"):
        r = b.post("/users/login", data={"username": attempt, "password": "' OR '1'='1"})
        assert r.status_code == 422 and "Wrong user name or password" in r.text
        assert b.get("/events/tag_search", params={"tag": attempt}).status_code == 200
    event_id = b.add_event(image=False, document=False, title="Robert'); DROP TABLE event;--", tags="sql")
    assert "Robert&#39;); DROP TABLE event;--" in b.get(f"/events/{event_id}").text
    assert b.post("/users/check_name", data={"username": "' OR 1=1 --"}).json()["available"] is False
    b.logout()
    b.login(name)  # the users are all still there


def test_control_characters_are_refused(olio_site):
    b = olio_site.browser()
    b.register()
    r = b.post("/events", data=event_fields(title="nul\x00byte"))
    assert r.status_code == 422 and "Title contains control characters" in r.text


def test_uploads_cannot_escape_the_file_store(olio_site):
    b = olio_site.browser()
    b.register()
    outside = olio_site.files.parent
    before = sorted(p.name for p in outside.iterdir())
    files = {"image": ("../../../escaped.png", picture(), "image/png"),
             "document": ("../../escaped.pdf", PDF, "application/pdf")}
    r = b.post("/events", data=event_fields(), files=files)
    assert r.status_code == 303
    assert sorted(p.name for p in outside.iterdir()) == before
    assert not list(olio_site.files.rglob("escaped*"))
    secret = olio_site.files / ".secret"
    secret.exists() or secret.write_text("x" * 64)  # a secret set by config: make a hidden file to probe
    for path in ("/files/../olio.db", "/files/%2e%2e/olio.db", "/files/..%2folio.db", "/files/.secret",
                 "/files/%2esecret", "/files/uploads/../.secret", "/files/etc/passwd", "/files/%2fetc/passwd",
                 "/static/../web.py", "/static/%2e%2e/web.py"):
        assert raw_get(olio_site.url, path) == 404, path  # sent as written (requests would normalize it)


def raw_get(url, path):
    """The final status of GET `path` sent byte for byte (redirects within the site followed)."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        location = response.getheader("Location", "")
        if response.status in (301, 302, 303, 307, 308):  # e.g. werkzeug merging "//" (308)
            assert location.startswith(("/", url)) and location != path, location
            return raw_get(url, location.removeprefix(url))
        return response.status
    finally:
        connection.close()


def test_oversized_requests_get_a_clear_413(olio_site):
    b = olio_site.browser()
    b.register()
    r = b.post("/events", data=event_fields(), files={"image": ("big.png", b"\0" * (17 << 20), "image/png")})
    assert r.status_code == 413
    if olio_site.stack.startswith("gunicorn-"):
        assert "at most 16 MiB" in r.text  # the app's own page
    else:
        # The front server (nginx, or the Sprout worker, both set to the app's 16 MiB) refuses
        # it before the app reads it, with its own words.
        assert "Too Large" in r.text or "payload_too_large" in r.text
    # The site is fine afterwards.
    assert b.get("/").status_code == 200


@pytest.fixture
def keyless_site(tmp_path):
    """A site without a configured secret; and a second one on the same file store."""
    servers = [Gunicorn(f"sqlite:///{tmp_path}/olio.db", tmp_path / "files").start() for _ in range(2)]
    yield servers
    for server in servers:
        server.stop()


def test_the_kept_secret_is_shared_and_survives_restarts(keyless_site, tmp_path):
    first, second = keyless_site
    key = (tmp_path / "files" / ".secret").read_text()
    assert len(key) == 64 and oct((tmp_path / "files" / ".secret").stat().st_mode)[-3:] == "600"
    b = Browser(first.url)
    user_id, name = b.register()
    b.url = second.url  # the same cookie, another set of processes
    assert "This is you." in b.get(f"/users/{user_id}").text
    first.stop()
    first.start()
    b.url = first.url
    assert "This is you." in b.get(f"/users/{user_id}").text
    assert (tmp_path / "files" / ".secret").read_text() == key
    forged = Browser(first.url)
    forged.session.cookies.set("session", re.sub(r"\.[^.]+$", ".AAAA", b.session.cookies["session"]))
    assert "This is you." not in forged.get(f"/users/{user_id}").text


def _key_of(root, queue):
    import olio.web

    queue.put(olio.web._kept_secret(root))


def test_processes_racing_to_make_the_secret_agree(tmp_path):
    import multiprocessing
    import sys

    from olio_fixtures import APP_PATH

    sys.path[:0] = [p for p in APP_PATH.split(":") if p not in sys.path]
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    racers = [context.Process(target=_key_of, args=(str(tmp_path), queue)) for _ in range(8)]
    for racer in racers:
        racer.start()
    keys = {queue.get(timeout=30) for _ in racers}
    for racer in racers:
        racer.join(timeout=30)
    assert keys == {(tmp_path / ".secret").read_text()} and [p.name for p in tmp_path.iterdir()] == [".secret"]
