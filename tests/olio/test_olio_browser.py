"""Olio in a real browser (headless Chromium through Selenium) on both real deployments, each
loaded with a small database: a user registers with a picture, logs out and in, adds an event
with a picture and tags, finds it by tag, attends it through the AJAX button and comments with
a rating; the registration form's AJAX name check reports a taken name. Every step asserts
what the user sees, the browser console must stay free of errors, and a failed step leaves a
screenshot and the page source in the test's tmp directory."""

import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from selenium.webdriver.support.ui import Select

from conftest import ROOT
from olio_browser import Chromium, StepFailed, start_chromium
from olio_fixtures import PDF, Browser, picture, unique, user_fields

sys.path.insert(0, str(ROOT / "apps" / "olio"))

import olio_deploy  # noqa: E402


@pytest.fixture(scope="module", params=["sprout", "conventional"])
def site(request):
    """The deployment, up with a small loaded database for the module's tests."""
    state = Path(tempfile.mkdtemp(prefix=f"olio-browser-{request.param}-", dir="/tmp"))
    state.chmod(0o755)  # PostgreSQL, nginx's workers and the sandboxes pass through it
    try:
        with olio_deploy.running(request.param, state / "state", cpus="0", cache=True,
                                 users=100, allow_small=True) as deployed:
            yield deployed
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def chromium(site, tmp_path):
    driver = start_chromium()
    try:
        yield Chromium(driver, site.url, tmp_path / "evidence")
    finally:
        driver.quit()


@pytest.fixture
def pictures(tmp_path):
    """Files on disk for the file inputs: a PNG portrait, a JPEG event picture, a PDF."""
    paths = {"portrait": tmp_path / "me.png", "party": tmp_path / "party.jpg", "document": tmp_path / "info.pdf"}
    paths["portrait"].write_bytes(picture((300, 200)))
    paths["party"].write_bytes(picture((800, 600), color=(40, 90, 200), kind="JPEG"))
    paths["document"].write_bytes(PDF)
    return paths


def register(c, username, portrait):
    """Fill in and send the registration form; the new user's id (it logs them in)."""
    with c.step("open the registration form"):
        c.open("/users/new")
        assert c.text("h1") == "Register"
        fields = user_fields(username, firstname="Grace", lastname="Hopper")
        fields["image"] = str(portrait)
        c.fill({k: v for k, v in fields.items() if v})
        c.wait_for_text("#name-check", f"{username} is free")  # checked when the name field was left
    with c.step("register"):
        c.submit("form.user-form")
        user_id = int(c.wait_for_path(r"/users/(\d+)").group(1))
        assert c.text("h1") == f"Grace Hopper ({username})"
        assert "This is you." in c.text(".relationship")
        assert c.text("header nav a.me") == username
        assert c.image_loaded(c.find("img.picture")) == (300, 200), "the uploaded picture is not shown"
    return user_id


def test_register_log_out_and_in_again(chromium, pictures):
    c, name = chromium, unique("br")
    user_id = register(c, name, pictures["portrait"])

    with c.step("log out"):
        c.find("header nav").find_element("link text", "Log out").click()
        c.wait_for_path(r"/")
        links = [a.text for a in c.find_all("header nav a")]
        assert "Log in" in links and "Register" in links and name not in links
        c.open(f"/users/{user_id}")
        assert "This is you." not in c.text(".person-detail")

    with c.step("a wrong password is refused"):
        c.find("header nav").find_element("link text", "Log in").click()
        c.wait_for_path(r"/users/login")
        c.fill({"username": name, "password": "not-the-password"})
        c.submit("form.login-form")
        c.wait_for_text(".errors", "Wrong user name or password")
        assert c.find("#username").get_attribute("value") == name  # kept for the next try
        assert c.find("#password").get_attribute("value") == ""  # never sent back
        c.console_errors(allow=[r"status of 422"])  # the refusal's status, as Chromium logs it

    with c.step("log in"):
        c.fill({"password": "secret1"})
        c.submit("form.login-form")
        c.wait_for_path(r"/")
        c.wait_for_text("header nav a.me", name)
        assert c.text("h1") == "Upcoming events"
        c.open(f"/users/{user_id}")
        assert "This is you." in c.text(".relationship")


def test_add_find_attend_and_comment_on_an_event(chromium, pictures):
    c, name = chromium, unique("br")
    register(c, name, pictures["portrait"])
    tag, title = unique("tag"), f"Picnic {unique('e')}"

    with c.step("add an event with a picture and tags"):
        c.find("header nav").find_element("link text", "Add event").click()
        c.wait_for_path(r"/events/new")
        c.fill({"title": title, "summary": "Bring food.", "description": "A long afternoon outside.",
                "date": "2099-06-01", "time": "14:30", "telephone": "555 0199", "street1": "2 Park Ave",
                "city": "Springfield", "state": "IL", "zip": "62701", "country": "USA",
                "tags": f"picnic, {tag}", "image": str(pictures["party"]), "document": str(pictures["document"])})
        c.submit("form.event-form")
        event_id = int(c.wait_for_path(r"/events/(\d+)").group(1))
        assert c.text("h1") == title

    with c.step("find it by tag"):
        c.open("/")
        search = c.find("header form.search input[name=tag]")
        search.send_keys(tag)
        search.submit()
        c.wait_for_path(r"/events/tag_search\?tag=" + tag)
        assert c.text("h1 q") == tag
        assert c.text(".event-list .count") == "1 event"
        found = c.find_all("li.event h3 a")
        assert [a.text for a in found] == [title]
        thumbnail = c.find("li.event img.thumb")
        assert "/files/" in thumbnail.get_attribute("src"), "the listing shows no thumbnail of the picture"
        assert c.image_loaded(thumbnail)[0] > 0

    with c.step("open it"):
        found[0].click()
        c.wait_for_path(rf"/events/{event_id}")
        assert c.text("h1") == title
        assert c.image_loaded(c.find("img.picture")) == (800, 600)
        assert [a.text for a in c.find_all(".tags a.tag")] == sorted(["picnic", tag])
        assert "Springfield, IL 62701" in c.text("address.where")
        assert "Event document (PDF" in c.text(".document")
        assert c.text("#attendee-count") == "0 attending"
        assert c.find("#attend button").is_displayed() and not c.find("#unattend button").is_displayed()
        assert c.text(".rating") == "Not rated yet"

    with c.step("attend it without leaving the page"):
        c.driver.execute_script("window.olioSamePage = true")
        c.find("#attend button").click()
        c.wait_for_text("#attendee-count", "1 attending")
        assert c.driver.execute_script("return window.olioSamePage === true"), "the page was reloaded"
        c.wait_for("#unattend button")
        assert not c.find("#attend button").is_displayed()

    with c.step("the attendance is kept"):
        assert c.driver.execute_script("return window.olioSamePage === true"), "the page was reloaded"
        c.driver.refresh()
        c.wait_for_text("#attendee-count", "1 attending")
        assert name in [a.text for a in c.find_all(".attendees ul.people a.person")]
        assert c.find("#unattend button").is_displayed() and not c.find("#attend button").is_displayed()

    with c.step("comment with a rating"):
        Select(c.find("#rating")).select_by_value("4")
        c.fill({"comment": "Lovely afternoon, would go again."})
        c.submit("form.comment-form")
        c.wait_for_path(rf"/events/{event_id}(#.*)?")
        comment = c.wait_for_text(".comment .text", "Lovely afternoon, would go again.")
        assert comment.text == "Lovely afternoon, would go again."
        assert c.text("#comments h2") == "Comments (1)"
        assert c.find(".comment .meta a.person").text == name
        assert c.find(".comment .stars").get_attribute("title") == "4 of 5"
        assert re.fullmatch(r"Rated 4(\.0)? from 1 vote", c.text(".rating")), c.text(".rating")


def test_name_check_reports_a_taken_name(chromium, site):
    c = chromium
    taken = unique("br")
    Browser(site.url).register(taken, image=False)  # someone else took it a moment ago
    with c.step("type a taken name"):
        c.open("/users/new")
        c.find("#username").send_keys(taken)
        c.find("#password").click()  # moving on to the next field, as a user does
        check = c.wait_for_text("#name-check", f"{taken} is taken")
        assert "taken" in check.get_attribute("class").split()
        assert c.path() == "/users/new", "the name check left the page"
    with c.step("change it to a free name"):
        free = unique("br")
        c.fill({"username": free})
        c.find("#password").click()
        check = c.wait_for_text("#name-check", f"{free} is free")
        assert "free" in check.get_attribute("class").split()
    with c.step("a malformed name is explained"):
        c.fill({"username": "a b"})
        c.find("#password").click()
        c.wait_for_text("#name-check", "a user name is 3-25 letters")
        assert "taken" in c.find("#name-check").get_attribute("class").split()


def break_script(c, how):
    """Break the home page's JavaScript after it loaded, and wait until the console says so."""
    c.open("/")
    if how == "a script is missing":  # as if the front server had lost olio.js
        c.driver.execute_script("var s = document.createElement('script');"
                                "s.src = '/static/js/missing.js'; document.head.appendChild(s);")
        c.wait(lambda d: c.console_shows(r"missing\.js.* 404"), "no console entry for the missing script")
    else:  # a script on the page throws
        c.driver.execute_script("var s = document.createElement('script');"
                                "s.textContent = 'throw new Error(\"olio test breakage\")';"
                                "document.body.appendChild(s);")
        c.wait(lambda d: c.console_shows("olio test breakage"), "no console entry for the exception")


@pytest.mark.parametrize("how, expected", [("a script is missing", r"missing\.js.*status of 404"),
                                           ("a script throws", r"Uncaught Error: olio test breakage")],
                         ids=["missing-script", "throwing-script"])
def test_broken_javascript_fails_the_step(chromium, tmp_path, how, expected):
    """The console check is real: a script that fails to load or throws fails its step, which
    leaves a screenshot and the page source."""
    c = chromium
    with pytest.raises(StepFailed, match=expected) as failed:
        with c.step("a page with broken JavaScript"):
            break_script(c, how)
            assert c.text("h1") == "Upcoming events"  # the page itself looks fine
    evidence = tmp_path / "evidence"
    assert (evidence / "01-a-page-with-broken-javascript.png").stat().st_size > 0
    assert "Upcoming events" in (evidence / "01-a-page-with-broken-javascript.html").read_text()
    assert str(evidence / "01-a-page-with-broken-javascript.png") in str(failed.value)
