"""Olio's pages and actions, through a real HTTP server (gunicorn) and client (requests), on
each stack of olio_fixtures.STACKS: rendering, paging and filters, accounts, events with
uploads, attendance, comments, friends, and form validation."""

import io
import re
from concurrent.futures import ThreadPoolExecutor
from datetime import date, timedelta

from PIL import Image

from olio_fixtures import PDF, Browser, event_fields, event_ids, picture, unique, uploads, user_fields


def test_home_page_renders_with_tag_cloud_and_assets(olio_site):
    b = olio_site.browser()
    b.register()
    event_id = b.add_event(tags=f"cloudy {unique('t')}")
    r = b.get("/")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/html")
    assert "<h1>Upcoming events</h1>" in r.text
    assert event_id in event_ids(r.text)
    assert re.search(r'<a class="tag size\d" href="/events/tag_search\?tag=cloudy"', r.text)
    for asset in ("/static/css/olio.css", "/static/js/olio.js", "/static/images/logo.png"):
        assert asset in r.text
        assert b.get(asset).status_code == 200


def test_register_login_logout(olio_site):
    b = olio_site.browser()
    user_id, name = b.register()
    page = b.get(f"/users/{user_id}").text
    assert f"({name})" in page and "This is you." in page and "Log out" in page
    assert b.logout().status_code == 303
    page = b.get(f"/users/{user_id}").text
    assert "This is you." not in page and 'href="/users/login"' in page
    wrong = b.post("/users/login", data={"username": name, "password": "nope"})
    assert wrong.status_code == 422 and "Wrong user name or password" in wrong.text
    assert f'value="{name}"' in wrong.text and "nope" not in wrong.text  # the name is kept, never the password
    r = b.post("/users/login", data={"username": name, "password": "secret1", "next": f"/users/{user_id}"})
    assert r.status_code == 303 and r.headers["Location"].endswith(f"/users/{user_id}")
    assert "This is you." in b.get(f"/users/{user_id}").text
    evil = b.post("/users/login", data={"username": name, "password": "secret1", "next": "//evil.example/x"})
    assert evil.headers["Location"] in ("/", f"{olio_site.url}/")  # never redirected off the site


def test_registration_saves_the_picture_and_a_thumbnail(olio_site):
    b = olio_site.browser()
    user_id, _ = b.register()
    page = b.get(f"/users/{user_id}").text
    name = re.search(r'<img class="picture" src="/files/([^"]+)" alt="[^"]*" width="300" height="200">', page).group(1)
    assert name.startswith("uploads/") and "me.png" not in name  # the store names files, never the client
    assert b.get(f"/files/{name}").content == picture((300, 200))


def test_check_name(olio_site):
    b = olio_site.browser()
    _, name = b.register()
    assert b.post("/users/check_name", data={"username": name}, ajax=True).json()["available"] is False
    free = b.post("/users/check_name", data={"username": unique()}, ajax=True).json()
    assert free["available"] is True
    bad = b.post("/users/check_name", data={"username": "a b"}, ajax=True).json()
    assert bad["available"] is False and "3-25" in bad["message"]


def test_registration_errors_keep_the_values_and_save_nothing(olio_site):
    b = olio_site.browser()
    before = uploads(olio_site.files)
    fields = user_fields(unique(), firstname="", email="not-an-address", password_confirm="other", zip="<>")
    r = b.post("/users", data=fields, files={"image": ("x.png", b"not an image at all", "image/png")})
    assert r.status_code == 422
    for message in ("First name is required", "E-mail is not an e-mail address", "The two passwords differ",
                    "Zip code must be letters", "Picture: the file is not a JPEG, PNG or GIF image"):
        assert message in r.text
    assert f'value="{fields["username"]}"' in r.text and 'value="Lovelace"' in r.text and "secret1" not in r.text
    assert b.post("/users/check_name", data={"username": fields["username"]}).json()["available"] is True
    taken = b.register()[1]
    other = Browser(olio_site.url)
    r = other.post("/users", data=user_fields(taken), files={"image": ("a.png", picture(), "image/png")})
    assert r.status_code == 422 and f"The user name &#39;{taken}&#39; is taken" in r.text
    huge = other.post("/users", data=user_fields(unique()), files={"image": ("a.png", b"\x89PNG" + bytes(5 << 20), "image/png")})
    assert huge.status_code == 422 and "larger than 4 MiB" in huge.text
    after = uploads(olio_site.files)
    assert set(before) <= set(after) and len(after) == len(before) + 2  # the one registration's picture and thumbnail


def test_add_event_with_image_document_and_thumbnail(olio_site):
    b = olio_site.browser()
    b.register()
    tag = unique("tag")
    event_id = b.add_event(title="Harvest fair", tags=f"{tag}, Fair  harvest,fair")
    page = b.get(f"/events/{event_id}").text
    assert "<h1>Harvest fair</h1>" in page and "Mon 1 Jun 2099, 14:30" in page
    assert re.findall(r'class="tag" href="/events/tag_search\?tag=([^"]+)"', page) == sorted(["fair", "harvest", tag])
    assert 'class="map" id="map" data-latitude="' in page
    image = re.search(r'<img class="picture" src="/files/([^"]+)"', page).group(1)
    full = Image.open(io.BytesIO(b.get(f"/files/{image}").content))
    assert full.size == (800, 600)
    listing = b.get(f"/events/tag_search?tag={tag}").text
    thumb = re.search(rf'<a href="/events/{event_id}"><img class="thumb" src="/files/([^"]+)"', listing).group(1)
    small = Image.open(io.BytesIO(b.get(f"/files/{thumb}").content))
    assert small.format == "JPEG" and max(small.size) <= 120 and small.size[0] * 3 == small.size[1] * 4
    assert (olio_site.files / thumb).is_file()
    document = re.search(r'<a href="/files/([^"]+\.pdf)">Event document', page).group(1)
    assert b.get(f"/files/{document}").content == PDF


def test_event_form_errors_keep_the_values_and_save_nothing(olio_site):
    b = olio_site.browser()
    b.register()
    before = uploads(olio_site.files)
    fields = event_fields(title="", date="2099-02-30", zip="", tags="ok, bad<tag>", summary="Kept summary")
    files = {"image": ("a.png", picture(), "image/png"), "document": ("d.pdf", b"<html>not a pdf", "application/pdf")}
    r = b.post("/events", data=fields, files=files)
    assert r.status_code == 422
    for message in ("Title is required", "Date is not a day between 2000 and 2100", "Zip code is required",
                    "Tags may hold only letters", "Document: the document is not a PDF file"):
        assert message in r.text
    assert ">Kept summary</textarea>" in r.text
    bad_time = b.post("/events", data=event_fields(time="25:99"))
    assert bad_time.status_code == 422 and "Time is not a time of day" in bad_time.text
    assert uploads(olio_site.files) == before  # the good image of the refused form was not kept


def test_home_page_paging_filters_and_order(olio_site):
    b = olio_site.browser()
    b.register()
    zip_code = unique("Z")[:10]
    day = date(2098, 3, 4)
    ids = [b.add_event(image=False, document=False, zip=zip_code, date=(day + timedelta(days=i % 3)).isoformat(),
                       time=f"{8 + i}:00", title=f"Event {i}") for i in range(12)]
    first = b.get(f"/?zip={zip_code}").text
    soonest = [ids[i] for i in sorted(range(12), key=lambda i: (i % 3, i))]  # by date, then time
    assert event_ids(first) == soonest[:10] and "12 events, page 1 of 2" in first
    second = b.get(f"/?zip={zip_code}&page=2")
    assert event_ids(second.text) == soonest[10:]
    assert f'href="/?page=1&amp;zip={zip_code}"' in second.text
    newest = b.get(f"/?zip={zip_code}&order=created_at").text
    assert event_ids(newest) == ids[::-1][:10]
    on_day = b.get(f"/?zip={zip_code}&date={day.isoformat()}").text
    assert event_ids(on_day) == ids[0::3]
    by_parts = b.get(f"/?zip={zip_code}&year=2098&month=3&day=4").text
    assert event_ids(by_parts) == event_ids(on_day)
    assert event_ids(b.get(f"/?zip={zip_code}&page=3").text) == []
    for bad, message in (("page=0", "page must be"), ("page=x", "page must be"), ("date=2098-13-01", "YYYY-MM-DD"),
                         ("year=2098&month=2", "give year, month and day"), ("order=title", "order must be"),
                         ("zip=%3Cb%3E", "zip must be")):
        r = b.get(f"/?{bad}")
        assert r.status_code == 400 and message in r.text, bad


def test_tag_search_pages(olio_site):
    b = olio_site.browser()
    b.register()
    tag = unique("paged")
    ids = [b.add_event(image=False, document=False, tags=tag) for _ in range(11)]
    first = b.get(f"/events/tag_search?tag={tag}")
    assert first.status_code == 200 and event_ids(first.text) == ids[::-1][:10]
    assert event_ids(b.get(f"/events/tag_search?tag={tag.upper()}&page=2").text) == ids[:1]
    assert "0 events" in b.get(f"/events/tag_search?tag={unique('none')}").text


def attendee_count(browser, event_id):
    return int(re.search(r'id="attendee-count" data-count="(\d+)"', browser.get(f"/events/{event_id}").text).group(1))


def test_attend_and_unattend(olio_site):
    host, guest = olio_site.browser(), olio_site.browser()
    host.register()
    guest_id, guest_name = guest.register()
    event_id = host.add_event(image=False, document=False)
    assert attendee_count(guest, event_id) == 0 and 'id="attend" method' in guest.get(f"/events/{event_id}").text
    r = guest.post(f"/events/{event_id}/attend")
    assert r.status_code == 303 and r.headers["Location"].endswith(f"/events/{event_id}")
    page = guest.get(f"/events/{event_id}").text
    assert attendee_count(guest, event_id) == 1 and f'href="/users/{guest_id}"' in page
    assert re.search(r'class="attend-form hidden" id="attend"', page)
    assert guest.post(f"/events/{event_id}/attend", ajax=True).json() == {"attending": True, "changed": False, "count": 1}
    assert host.post(f"/events/{event_id}/attend", ajax=True).json() == {"attending": True, "changed": True, "count": 2}
    assert guest.post(f"/events/{event_id}/unattend", ajax=True).json() == {"attending": False, "changed": True, "count": 1}
    assert attendee_count(host, event_id) == 1
    assert guest.post("/events/99999999/attend").status_code == 404


def test_comments_create_edit_delete_and_who_may(olio_site):
    author, other = olio_site.browser(), olio_site.browser()
    author.register()
    other.register()
    event_id = author.add_event(image=False, document=False)
    assert "Not rated yet" in author.get(f"/events/{event_id}").text
    r = author.post(f"/events/{event_id}/comments", data={"rating": "4", "comment": "Great fun"})
    assert r.status_code == 303
    comment_id = int(re.search(r"#comment-(\d+)$", r.headers["Location"]).group(1))
    other.post(f"/events/{event_id}/comments", data={"rating": "1", "comment": "Too loud"})
    page = other.get(f"/events/{event_id}").text
    assert "Great fun" in page and "Too loud" in page and "Rated" in page and "2.5 from 2 votes" in page
    bad = other.post(f"/events/{event_id}/comments", data={"rating": "9", "comment": "Kept text"})
    assert bad.status_code == 422 and "Rating must be a whole number from 1 to 5" in bad.text and "Kept text</textarea>" in bad.text
    edit = f"/events/{event_id}/comments/{comment_id}/edit"
    assert other.get(edit).status_code == 403
    assert other.post(edit, data={"rating": "1", "comment": "hijacked"}).status_code == 403
    assert other.post(f"/events/{event_id}/comments/{comment_id}/delete").status_code == 403
    form = author.get(edit).text
    assert ">Great fun</textarea>" in form and '<option value="4" selected>' in form
    assert author.post(edit, data={"rating": "5", "comment": ""}).status_code == 422
    assert author.post(edit, data={"rating": "5", "comment": "Even better"}).status_code == 303
    page = author.get(f"/events/{event_id}").text
    assert "Even better" in page and "Great fun" not in page and "hijacked" not in page and "3.0 from 2 votes" in page
    assert author.post(f"/events/{event_id}/comments/{comment_id}/delete").status_code == 303
    page = author.get(f"/events/{event_id}").text
    assert "Even better" not in page and "1.0 from 1 vote" in page
    assert author.get(edit).status_code == 404
    assert author.get(f"/events/{event_id + 1000000}/comments/1/edit").status_code == 404


def friends_shown(browser, user_id):
    section = browser.get(f"/users/{user_id}").text.split('id="friends"')[1]
    return sorted(int(i) for i in re.findall(r'href="/users/(\d+)"', section))


def test_friends_invite_approve_reject_revoke(olio_site):
    a, b, c, d = (olio_site.browser() for _ in range(4))
    (a_id, _), (b_id, _), (c_id, _), (d_id, _) = a.register(), b.register(), c.register(), d.register()
    assert "Add as friend" in a.get(f"/users/{b_id}").text
    assert a.post(f"/users/{b_id}/invite").status_code == 303
    assert "You asked" in a.get(f"/users/{b_id}").text
    incoming = b.get(f"/users/{b_id}").text.split('id="incoming"')[1].split("</section>")[0]
    assert f'href="/users/{a_id}"' in incoming
    outgoing = a.get(f"/users/{a_id}").text.split('id="outgoing"')[1].split("</section>")[0]
    assert f'href="/users/{b_id}"' in outgoing
    again = a.post(f"/users/{b_id}/invite")
    assert again.status_code == 409 and "already a friend request" in again.text
    assert b.post(f"/users/{a_id}/approve").status_code == 303
    assert friends_shown(a, a_id) == [b_id] and friends_shown(c, b_id) == [a_id]
    assert "You are friends." in a.get(f"/users/{b_id}").text
    assert b.post(f"/users/{a_id}/invite").status_code == 409
    c.post(f"/users/{b_id}/invite")
    assert b.post(f"/users/{c_id}/reject").status_code == 303
    assert friends_shown(b, b_id) == [a_id] and "Add as friend" in c.get(f"/users/{b_id}").text
    d.post(f"/users/{b_id}/invite")
    assert d.post(f"/users/{b_id}/revoke", ajax=True).json()["ok"] is True
    assert b.post(f"/users/{d_id}/approve").status_code == 409  # nothing left to approve
    assert b.post(f"/users/{b_id}/invite").status_code == 409  # yourself
    assert c.post(f"/users/{a_id}/reject").status_code == 409
    assert c.post("/users/99999999/invite").status_code == 404
    assert friends_shown(b, b_id) == [a_id] and friends_shown(d, d_id) == []


def test_static_and_file_store_answer_if_modified_since(olio_site):
    b = olio_site.browser()
    b.register()
    event_id = b.add_event()
    image = re.search(r'src="/files/([^"]+)"', b.get(f"/events/{event_id}").text).group(1)
    for path in ("/static/css/olio.css", "/static/images/star-on.png", f"/files/{image}"):
        first = b.get(path)
        assert first.status_code == 200 and "Last-Modified" in first.headers, path
        again = b.get(path, headers={"If-Modified-Since": first.headers["Last-Modified"]})
        assert again.status_code == 304 and again.content == b"", path
        stale = b.get(path, headers={"If-Modified-Since": "Mon, 01 Jan 2001 00:00:00 GMT"})
        assert stale.status_code == 200 and stale.content == first.content
    assert b.get("/static/css/olio.css").headers["Content-Type"].startswith("text/css")
    assert b.get(f"/files/{image}").headers["Content-Type"] == "image/jpeg"


def test_concurrent_writes_keep_every_count(olio_site):
    """Several people at once add events with the same new tag and rate the same event: the
    transactions (retried on conflicts) lose no tagging, refcount, vote or attendance."""
    people = [olio_site.browser() for _ in range(6)]
    for person in people:
        person.register()
    tag, target = unique("race"), people[0].add_event(image=False, document=False)
    with ThreadPoolExecutor(len(people)) as pool:
        added = list(pool.map(lambda p: p.add_event(image=False, document=False, tags=f"{tag} shared"), people))
        rated = list(pool.map(lambda p: p.post(f"/events/{target}/comments", data={"rating": "4", "comment": "x"}), people))
        went = list(pool.map(lambda p: p.post(f"/events/{target}/attend", ajax=True).json()["changed"], people))
    assert all(r.status_code == 303 for r in rated) and went == [True] * len(people)
    assert sorted(event_ids(people[0].get(f"/events/tag_search?tag={tag}").text)) == sorted(added)
    assert f'href="/events/tag_search?tag={tag}" title="6 events"' in people[0].get("/").text
    page = people[0].get(f"/events/{target}").text
    assert "4.0 from 6 votes" in page and 'data-count="6"' in page
