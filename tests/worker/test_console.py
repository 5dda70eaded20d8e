"""The web console (`GET /console`) in a real browser (headless Chromium through Selenium)
against a real worker: without a session it sends the browser to its login form; a wrong token
is refused there, the worker's token logs in with a cookie that authorizes reading only; the
lambdas table, the last hour's charts (`/stats/history`), the sandboxes, memory budget and
Zygote tree panels (`/stats`) and the logs panel (`/logs`) show two lambdas invoked, one of
them failing; the request-id search finds one invocation's lines; API errors show in a
banner. The browser console must stay free of errors; a failed step leaves a screenshot and
the page source in the test's tmp directory.

With SPROUT_SCREENSHOTS=1 the logged-in console and its logs panel are saved to
docs/images/console.png and docs/images/console-logs.png (else to the test's tmp directory).
"""

import os
import re

import pytest
import requests
from selenium.webdriver.support.ui import Select

from conftest import ROOT, Worker, targz
from olio_browser import Chromium, start_chromium

REQUEST_ID = re.compile(r"[0-9a-f]{16}")
COOKIE = "sprout_console"

TALKER = '''"""Says hello on stdout and warns through logging (stderr)."""
import logging

def f(event):
    n = (event or {}).get("n")
    print(f"hello from talker {n}", flush=True)
    logging.getLogger("talker").warning("talker warned %s", n)
    return {"n": n}
'''

FAILER = '''"""Writes a line, then fails: 500 handler_exception."""

def f(event):
    print(f"failer about to fail on {event!r}", flush=True)
    raise RuntimeError("the console test's failure")
'''

WSGI_COOKIES = '''
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [environ.get("HTTP_COOKIE", "(none)").encode()]
'''

TALKS, FAILS = 6, 3


def token_of(worker):
    return (worker.dir / "api-token").read_text().strip()


@pytest.fixture(scope="module")
def console_worker(tmp_path_factory, sprout_bin):
    """A worker with a memory budget (so the panel has a bar), the two lambdas of the tests
    and a WSGI one, each invoked: the talker TALKS times, the failer FAILS times."""
    w = Worker(tmp_path_factory.mktemp("worker"), {"instances": {"memory_budget_mb": 1024}})
    w.start()
    w.versions = {name: w.deploy_source(name, source)["version"]
                  for name, source in (("talker", TALKER), ("failer", FAILER), ("cookies", WSGI_COOKIES))}
    w.request_ids = {"talker": [], "failer": []}
    for n in range(TALKS):
        reply = requests.post(f"{w.url}/run/talker", json={"n": n}, timeout=60)
        assert reply.status_code == 200, reply.text
        w.request_ids["talker"].append(reply.headers.get("X-Sprout-Request-Id"))
    for n in range(FAILS):
        reply = requests.post(f"{w.url}/run/failer", json={"n": n}, timeout=60)
        assert reply.status_code == 500 and reply.json()["error"] == "handler_exception", reply.text
        w.request_ids["failer"].append(reply.headers.get("X-Sprout-Request-Id"))
    yield w
    w.stop()
    assert w.leftovers() == [], f"worker left {w.leftovers()}"


def browser(worker, tmp_path, width=1280, height=900):
    return Chromium(start_chromium(width, height), worker.url, tmp_path / "evidence")


@pytest.fixture
def chromium(console_worker, tmp_path):
    c = browser(console_worker, tmp_path)
    try:
        yield c
    finally:
        c.driver.quit()


def screenshot_dir(tmp_path):
    if os.environ.get("SPROUT_SCREENSHOTS") == "1":
        out = ROOT / "docs" / "images"
        out.mkdir(parents=True, exist_ok=True)
        return out
    return tmp_path


def refreshes(c):
    return int(c.driver.execute_script("return document.body.dataset.refreshes || '0'"))


def wait_for_refresh(c, after=0):
    """Until the page has read the API more than `after` times; how many times it has."""
    c.wait(lambda d: refreshes(c) > after, f"the console did not refresh past {after}")
    return refreshes(c)


def log_in(c, worker):
    with c.step("log in with the worker's token"):
        c.open("/console")
        c.wait_for_path(r"/console/login")
        c.fill({"token": token_of(worker)})
        c.submit("#login-form")
        c.wait_for_path(r"/console(#.*)?")
        assert c.text("h1") == "Sprout console"
        assert {ck["name"]: ck for ck in c.driver.get_cookies()}[COOKIE]["httpOnly"] is True
        wait_for_refresh(c)


def select_lambda(c, name):
    Select(c.find("#lambda-select")).select_by_value(name)
    c.wait(lambda d: c.find(f'tr[data-lambda="{name}"]').get_attribute("class") == "selected", f"{name} was not selected")


def chart_total(c, chart):
    return float(c.find(f"#chart-{chart}").get_attribute("data-total") or 0)


def log_lines(c):
    return [(line.get_attribute("data-request"), line.text) for line in c.find_all("#logs .log-line")]


# ---------------------------------------------------------------- logging in

def test_a_browser_without_a_session_is_sent_to_the_login_and_a_wrong_token_refused(chromium, console_worker):
    c = chromium
    with c.step("the console sends a browser without a session to the login form"):
        c.open("/console")
        c.wait_for_path(r"/console/login")
        assert c.find("#token").get_attribute("type") == "password"
        assert not c.find_all("#login-message")
    with c.step("a wrong token is refused with the form again"):
        c.fill({"token": "0" * 64})
        c.submit("#login-form")
        c.wait_for_text("#login-message", "not this worker's token")
        assert c.path() == "/console/login" and c.find_all("#login-form")
        assert COOKIE not in {ck["name"] for ck in c.driver.get_cookies()}
        # The 403 itself is the answer expected here.
        assert c.console_errors(allow=[r"/console/login - Failed to load resource: .* 403"]) == []
    with c.step("still no way in without the token"):
        c.open("/console")
        c.wait_for_path(r"/console/login")


def test_the_right_token_logs_in_and_logging_out_ends_the_session(chromium, console_worker):
    c = chromium
    log_in(c, console_worker)
    with c.step("the header shows the worker"):
        c.wait(lambda d: c.text("#worker-backend") == "sock", "the back-end is not shown")
        assert re.fullmatch(r"\d+[smhd].*", c.text("#worker-uptime")), c.text("#worker-uptime")
        assert int(c.text("#worker-invocations").replace(",", "")) >= TALKS + FAILS
    with c.step("log out"):
        c.find("#logout").click()
        c.wait_for_path(r"/console/login")
        assert COOKIE not in {ck["name"] for ck in c.driver.get_cookies()}
        c.open("/console")
        c.wait_for_path(r"/console/login")


def test_the_cookie_authorizes_reading_only_and_no_lambda_sees_it(console_worker):
    w = console_worker
    refused = requests.post(f"{w.url}/console/login", data={"token": "f" * 64}, allow_redirects=False, timeout=30)
    assert refused.status_code == 403 and "not this worker" in refused.text and "set-cookie" not in refused.headers
    login = requests.post(f"{w.url}/console/login", data={"token": token_of(w)}, allow_redirects=False, timeout=30)
    assert login.status_code == 303 and login.headers["Location"] == "/console"
    set_cookie = login.headers["Set-Cookie"]
    assert re.fullmatch(rf"{COOKIE}=[0-9a-f]{{64}}; HttpOnly; SameSite=Strict; Path=/", set_cookie), set_cookie
    session = login.cookies[COOKIE]
    assert session != token_of(w), "the cookie holds a session secret, not the token"
    jar = {COOKIE: session}

    for path in ("/stats", "/registry", "/registry/talker", "/console", "/console/assets/console.js"):
        reply = requests.get(w.url + path, cookies=jar, timeout=30)
        assert reply.status_code == 200, f"GET {path}: {reply.status_code} {reply.text[:200]}"
    assert requests.head(f"{w.url}/stats", cookies=jar, timeout=30).status_code == 200

    # Never a change: not a deletion, an upload or a site.
    deletion = requests.delete(f"{w.url}/registry/talker", cookies=jar, timeout=30)
    assert deletion.status_code in (401, 403), deletion.text
    upload = requests.post(f"{w.url}/registry/intruder", data=targz({"f.py": "def f(e):\n    return 1\n"}), cookies=jar, timeout=30)
    assert upload.status_code in (401, 403), upload.text
    site = requests.put(f"{w.url}/sites/a.example", json={"lambda": "talker"}, cookies=jar, timeout=30)
    assert site.status_code in (401, 403), site.text
    assert sorted(w.client.list()) == ["cookies", "failer", "talker"]

    # A wrong session is refused; the console's page sends it back to the login.
    assert requests.get(f"{w.url}/stats", cookies={COOKIE: "0" * 64}, timeout=30).status_code == 403
    stale = requests.get(f"{w.url}/console", cookies={COOKIE: "0" * 64}, allow_redirects=False, timeout=30)
    assert stale.status_code == 303 and stale.headers["Location"] == "/console/login"
    # Without credentials the API keeps its JSON 401; only the console's page redirects.
    bare = requests.get(f"{w.url}/stats", timeout=30)
    assert bare.status_code == 401 and bare.json()["error"] == "unauthorized"
    assert requests.get(f"{w.url}/console/assets/console.js", timeout=30).status_code == 401
    page = requests.get(f"{w.url}/console/", allow_redirects=False, timeout=30)
    assert page.status_code == 303 and page.headers["Location"] == "/console/login"

    # The assets: their types, never cached without asking.
    for name, kind in (("console.js", "text/javascript"), ("console.css", "text/css")):
        reply = requests.get(f"{w.url}/console/assets/{name}", cookies=jar, timeout=30)
        assert reply.headers["Content-Type"].startswith(kind) and reply.headers["Cache-Control"] == "no-cache"
    assert requests.get(f"{w.url}/console/assets/nope.js", cookies=jar, timeout=30).status_code == 404

    # A lambda never sees the session, on /run as on the app port.
    seen = requests.get(f"{w.url}/run/cookies", cookies={**jar, "theirs": "1"}, timeout=30)
    assert seen.status_code == 200 and session not in seen.text, seen.text

    # Logging out clears the cookie.
    logout = requests.post(f"{w.url}/console/logout", cookies=jar, allow_redirects=False, timeout=30)
    assert logout.status_code == 303 and logout.headers["Location"] == "/console/login"
    assert re.match(rf"{COOKIE}=;.*Max-Age=0", logout.headers["Set-Cookie"]), logout.headers["Set-Cookie"]


# ---------------------------------------------------------------- the panels

def test_the_panels_show_the_lambdas_their_last_hour_and_the_worker(console_worker, tmp_path):
    w = console_worker
    c = browser(w, tmp_path, 1440, 1900)
    try:
        log_in(c, w)
        with c.step("the lambdas table lists both with their versions and figures"):
            for name in ("talker", "failer"):
                c.wait_for(f'tr[data-lambda="{name}"]')
                c.wait(lambda d, name=name: c.text(f'tr[data-lambda="{name}"] td[data-col="version"]') == str(w.versions[name]),
                       f"{name}'s version is not shown")
            served = lambda name: int(c.text(f'tr[data-lambda="{name}"] td[data-col="served"]').replace(",", ""))
            c.wait(lambda d: served("talker") >= TALKS and served("failer") >= FAILS, "the served counts are not shown")
            uploaded = c.text('tr[data-lambda="talker"] td[data-col="uploaded"]')
            assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", uploaded), uploaded
            assert int(c.text('tr[data-lambda="talker"] td[data-col="sandboxes"]')) >= 1
        with c.step("the sandboxes, memory budget and Zygote tree panels"):
            assert c.text("#sandboxes-backend") == "sock"
            idle = int(c.text("#sandboxes-idle"))
            busy = int(c.text("#sandboxes-busy"))
            assert idle + busy >= 1
            assert c.find("#memory-budget").get_attribute("data-budget") == "set"
            assert "of 1024 MiB" in c.text("#memory-summary")
            assert float(c.find("#memory-budget").get_attribute("data-used")) > 0
            assert "root (no packages)" in c.text("#zygote-tree")
            assert re.search(r"\d+ Zygotes", c.text("#zygote-summary"))
            assert re.fullmatch(r"[\d.,]+ of 1024 MiB", c.text("#handler-pss")), c.text("#handler-pss")
        with c.step("the talker's last hour: invocations, no errors, a cold start, its latency"):
            select_lambda(c, "talker")
            c.wait(lambda d: chart_total(c, "invocations") >= TALKS, "the talker's invocations are not charted")
            assert chart_total(c, "errors") == 0
            assert chart_total(c, "cold-starts") >= 1
            assert int(c.find("#chart-latency").get_attribute("data-points")) >= 1
            assert re.search(r"talker: \d+ invocations, 0 errors", c.text("#history-summary")), c.text("#history-summary")
            for chart in ("invocations", "errors", "cold-starts", "latency"):
                labels = [t.text for t in c.find_all(f"#chart-{chart} text.label")]
                assert any(label.startswith("time") for label in labels), f"{chart} has no time axis label: {labels}"
        with c.step("the failer's last hour: its errors"):
            select_lambda(c, "failer")
            c.wait(lambda d: chart_total(c, "errors") >= FAILS, "the failer's errors are not charted")
            assert chart_total(c, "invocations") >= FAILS
            assert c.find("#error-banner").get_attribute("hidden") is not None, c.text("#error-banner")
        with c.step("the failer's logs"):
            c.wait(lambda d: any("failer about to fail" in text for _, text in log_lines(c)), "the failer's lines are not shown")
            starts = c.find_all("#logs .log-line.type-start")
            reports = c.find_all("#logs .log-line.type-report")
            assert len(starts) >= FAILS and len(reports) >= FAILS
            assert any("START RequestId:" in s.text for s in starts) and any("REPORT RequestId:" in r.text for r in reports)
            # TIME REQUEST8 MESSAGE
            line = next(text for _, text in log_lines(c) if "failer about to fail" in text)
            assert re.match(r"\d\d:\d\d:\d\d\.\d{3} [0-9a-f]{8} failer about to fail", line), line
        with c.step("the talker's logs, and a screenshot"):
            select_lambda(c, "talker")
            c.wait(lambda d: any(f"hello from talker {TALKS - 1}" in text for _, text in log_lines(c)), "the talker's lines are not shown")
            out = screenshot_dir(tmp_path)
            height = c.driver.execute_script(  # the whole page, no more: its end, and the window's own frame
                "return Math.ceil(document.querySelector('footer').getBoundingClientRect().bottom) + 8"
                " + window.outerHeight - window.innerHeight")
            c.driver.set_window_size(1440, height)
            c.driver.save_screenshot(str(out / "console.png"))
            c.find("#panel-logs").screenshot(str(out / "console-logs.png"))
        with c.step("Python's logging in the talker's logs, as [LEVEL] logger: message"):
            texts = [text for _, text in log_lines(c)]
            assert any(f"[WARNING] talker: talker warned {TALKS - 1}" in text for text in texts), texts
    finally:
        c.driver.quit()


def test_the_request_id_search_finds_one_invocations_lines(chromium, console_worker):
    c, w = chromium, console_worker
    talk, fail = w.request_ids["talker"][2], w.request_ids["failer"][1]
    with c.step("each invocation's reply carried its request id"):
        for name, ids in w.request_ids.items():
            assert all(i and REQUEST_ID.fullmatch(i) for i in ids), f"{name}: X-Sprout-Request-Id missing or malformed: {ids}"
            assert len(set(ids)) == len(ids)
    log_in(c, w)
    with c.step("search a talker request's id"):
        select_lambda(c, "talker")
        c.fill({"request-search": talk})
        c.find("#request-search-button").click()
        c.wait(lambda d: c.find("#logs").get_attribute("data-search") == talk, "the search did not run")
        lines = log_lines(c)
        assert lines and all(request == talk for request, _ in lines), lines
        texts = [text for _, text in lines]
        assert any("hello from talker 2" in t for t in texts), texts
        assert not any("hello from talker 3" in t for t in texts), texts
        assert c.find_all("#logs .log-line.type-start") and c.find_all("#logs .log-line.type-report")
    with c.step("search the failer's request from the talker's panel: the search spans lambdas"):
        c.fill({"request-search": fail})
        c.find("#request-search-button").click()
        c.wait(lambda d: c.find("#logs").get_attribute("data-search") == fail, "the second search did not run")
        lines = log_lines(c)
        assert lines and all(request == fail for request, _ in lines), lines
        assert any("failer about to fail on {'n': 1}" in text for _, text in lines), lines
        assert {line.get_attribute("data-lambda") for line in c.find_all("#logs .log-line")} == {"failer"}
    with c.step("back to the talker's lines; a click on a request id searches it"):
        c.find("#request-search-clear").click()
        c.wait(lambda d: c.find("#logs").get_attribute("data-search") is None, "the search was not cleared")
        c.wait(lambda d: any(f"hello from talker {TALKS - 1}" in text for _, text in log_lines(c)), "the talker's lines did not come back")
        request = next(r for r in c.find_all("#logs .log-line .request") if r.get_attribute("class") == "request")
        request.click()
        c.wait(lambda d: (c.find("#logs").get_attribute("data-search") or "") != "", "a click on a request id did not search it")
        searched = c.find("#logs").get_attribute("data-search")
        assert all(r == searched for r, _ in log_lines(c))
    with c.step("the auto-refresh toggle stops reading the logs"):
        c.find("#request-search-clear").click()
        c.find("#logs-auto").click()
        assert not c.find("#logs-auto").is_selected()
        before = log_lines(c)
        reply = requests.post(f"{w.url}/run/talker", json={"n": 99}, timeout=60)
        assert reply.status_code == 200
        wait_for_refresh(c, wait_for_refresh(c, refreshes(c)))  # two refreshes after the invocation
        assert log_lines(c) == before and "auto-refresh off" in c.text("#logs-summary")
        c.find("#logs-auto").click()
        c.wait(lambda d: any("hello from talker 99" in text for _, text in log_lines(c)), "turned back on, the logs did not refresh")


# ---------------------------------------------------------------- errors

def test_an_api_error_shows_in_the_banner(make_worker, tmp_path):
    """A worker restart makes a new session secret: the page's next reads are refused (403),
    and the banner says so, with the way back to the login."""
    w = make_worker()
    c = browser(w, tmp_path)
    try:
        log_in(c, w)
        with c.step("no errors while the worker answers"):
            assert c.find("#error-banner").get_attribute("hidden") is not None, c.text("#error-banner")
        with c.step("the worker restarts: the banner shows the refusals"):
            w.stop()
            w.start()
            c.wait_for("#error-banner")
            c.wait_for_text("#error-list", "GET /stats: 403 forbidden")
            c.wait_for("#error-login")
            assert c.find("#error-login a").get_attribute("href").endswith("/console/login")
            # The refused reads (and those the restart left unanswered) are the expected errors.
            allowed = [r"Failed to load resource: .* 403", r"net::ERR_CONNECTION_REFUSED", r"Failed to fetch"]
            assert c.console_errors(allow=allowed) == []
        with c.step("logging in again clears it"):
            c.find("#error-login a").click()
            c.wait_for_path(r"/console/login")
            c.fill({"token": token_of(w)})
            c.submit("#login-form")
            c.wait_for_path(r"/console(#.*)?")
            wait_for_refresh(c)
            assert c.find("#error-banner").get_attribute("hidden") is not None, c.text("#error-banner")
    finally:
        c.driver.quit()


# ---------------------------------------------------------------- a tenant's console


def test_a_tenants_key_logs_in_to_a_console_of_its_own_lambdas_only(console_worker, tmp_path):
    w = console_worker
    token = {"Authorization": f"Bearer {token_of(w)}"}
    assert requests.post(f"{w.url}/tenants", json={"name": "acme"}, headers=token, timeout=30).status_code == 201
    issued = requests.post(f"{w.url}/tenants/acme/keys", json={}, headers=token, timeout=30).json()
    key = {"Authorization": f"Bearer {issued['key']}"}
    upload = requests.post(f"{w.url}/registry/acme-fn", data=targz({"f.py": "def f(e):\n    print('acme ran')\n    return e\n"}),
                           headers=key, timeout=60)
    assert upload.status_code == 201, upload.text
    assert requests.post(f"{w.url}/run/acme-fn", json=1, timeout=60).status_code == 200
    c = browser(w, tmp_path)
    try:
        with c.step("log in with the tenant's key"):
            c.open("/console")
            c.wait_for_path(r"/console/login")
            c.fill({"token": issued["key"]})
            c.submit("#login-form")
            c.wait_for_path(r"/console(#.*)?")
            wait_for_refresh(c)
            assert c.text("#principal") == "· tenant acme"
        with c.step("only its lambda, its history and logs; no worker figures, no errors"):
            c.wait_for('tr[data-lambda="acme-fn"]')
            assert [row.get_attribute("data-lambda") for row in c.find_all("tr[data-lambda]")] == ["acme-fn"]
            assert c.find("#worker").get_attribute("hidden") is not None
            c.wait(lambda d: any("acme ran" in text for _, text in log_lines(c)), "its lines are not shown")
            assert c.find("#error-banner").get_attribute("hidden") is not None, c.text("#error-banner")
        with c.step("the session reads only: its cookie is the key, refused for changes and for others' lambdas"):
            cookie = {COOKIE: {ck["name"]: ck for ck in c.driver.get_cookies()}[COOKIE]["value"]}
            assert requests.get(f"{w.url}/console/session", cookies=cookie, timeout=30).json() == {
                "principal": "tenant", "tenant": "acme", "key": issued["id"]}
            assert requests.get(f"{w.url}/registry", cookies=cookie, timeout=30).json() == ["acme-fn"]
            assert requests.get(f"{w.url}/stats", cookies=cookie, timeout=30).status_code == 403
            assert requests.get(f"{w.url}/logs/talker", cookies=cookie, timeout=30).status_code == 404
            assert set(requests.get(f"{w.url}/stats/history", cookies=cookie, timeout=30).json()["lambdas"]) <= {"acme-fn"}
            assert requests.delete(f"{w.url}/registry/acme-fn", cookies=cookie, timeout=30).status_code == 403
        with c.step("a revoked key ends the session"):
            requests.delete(f"{w.url}/tenants/acme/keys/{issued['id']}", headers=token, timeout=30)
            c.open("/console")
            c.wait_for_path(r"/console/login")
    finally:
        c.driver.quit()
        requests.delete(f"{w.url}/registry/acme-fn", headers=token, timeout=30)
        requests.delete(f"{w.url}/tenants/acme", headers=token, timeout=30)


def test_a_wrong_tenant_key_does_not_log_in(console_worker):
    forged = "spk_" + "0" * 16 + "_" + "1" * 64
    reply = requests.post(f"{console_worker.url}/console/login", data={"token": forged}, allow_redirects=False, timeout=30)
    assert reply.status_code == 403 and "revoked, expired or not this worker" in reply.text
    assert COOKIE not in reply.cookies
