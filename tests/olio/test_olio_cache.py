"""Olio's caching against real cache servers (stock memcached and the Sprout cache): a site
with the cache and one without, on the same database, serve the same pages; writes show at
once through the cache; and a cache server killed mid-test leaves every page working."""

import re

import pytest

from olio_fixtures import Browser, Gunicorn, new_secret, unique


@pytest.fixture(params=["memcached", "sprout"])
def two_sites(request, make_cache_server, tmp_path):  # noqa: F811
    """(cache server, site with the cache, site without), one database and file store."""
    server = make_cache_server(request.param)
    db, files, secret = f"sqlite:///{tmp_path}/olio.db", tmp_path / "files", new_secret()
    cached = Gunicorn(db, files, cache=server.spec, secret=secret).start()
    plain = Gunicorn(db, files, secret=secret).start()
    yield server, cached, plain
    cached.stop()
    plain.stop()


def populate(browser):
    """Users, events, tags, comments, attendance and friends made through the pages; the
    paths of the pages that show them."""
    friend = Browser(browser.url)
    friend_id, _ = friend.register()
    user_id, _ = browser.register()
    tag = unique("c")
    events = [browser.add_event(image=i == 0, document=False, tags=f"{tag} shared", title=f"Cached {i}") for i in range(12)]
    browser.post(f"/events/{events[0]}/comments", data={"rating": "4", "comment": "Nice"})
    friend.post(f"/events/{events[0]}/attend")
    friend.post(f"/users/{user_id}/invite")
    return user_id, friend_id, events, [
        "/", "/?page=2", "/?order=created_at", f"/events/tag_search?tag={tag}", f"/events/tag_search?tag={tag}&page=2",
        f"/events/{events[0]}", f"/events/{events[5]}", f"/users/{user_id}", f"/users/{friend_id}",
    ]


def same_pages(browser, cached, plain, paths):
    for path in paths:
        browser.url = cached.url
        through_cache = browser.get(path)
        browser.url = plain.url
        direct = browser.get(path)
        assert through_cache.status_code == direct.status_code == 200, path
        assert through_cache.text == direct.text, path
    browser.url = cached.url


def test_cache_on_and_off_give_the_same_pages(two_sites):
    server, cached, plain = two_sites
    browser = Browser(cached.url)
    user_id, friend_id, events, paths = populate(browser)
    anonymous = Browser(cached.url)
    for _ in range(2):  # the second round reads what the first stored
        same_pages(browser, cached, plain, paths)
        same_pages(anonymous, cached, plain, paths)
    stats = server.stats()
    assert int(stats["get_hits"]) > 0 and int(stats["curr_items"]) > len(paths)
    # Writes through the cached site show at once: their counters moved the keys.
    browser.post(f"/events/{events[5]}/comments", data={"rating": "2", "comment": "Fresh comment"})
    assert "Fresh comment" in browser.get(f"/events/{events[5]}").text
    browser.post(f"/events/{events[5]}/attend")
    assert 'data-count="1"' in browser.get(f"/events/{events[5]}").text
    browser.post(f"/users/{friend_id}/approve")
    assert re.search(rf'id="friends".*href="/users/{friend_id}"', browser.get(f"/users/{user_id}").text, re.S)
    new_event = browser.add_event(image=False, document=False, title="Brand new", tags="shared")
    assert "Brand new" in browser.get("/?order=created_at").text
    assert "Brand new" in browser.get(f"/users/{user_id}").text
    same_pages(browser, cached, plain, paths + [f"/events/{new_event}"])


def test_a_killed_cache_server_breaks_no_page(two_sites):
    server, cached, plain = two_sites
    browser = Browser(cached.url)
    user_id, _, events, paths = populate(browser)
    same_pages(browser, cached, plain, paths)
    server.kill()
    same_pages(browser, cached, plain, paths)
    r = browser.post(f"/events/{events[1]}/comments", data={"rating": "5", "comment": "Still works"})
    assert r.status_code == 303 and "Still works" in browser.get(f"/events/{events[1]}").text
    assert browser.post(f"/events/{events[1]}/attend", ajax=True).json()["count"] == 1
    browser.add_event(image=False, document=False, title="After the crash")
    same_pages(browser, cached, plain, paths)
    assert "Traceback" not in cached.read_log()
