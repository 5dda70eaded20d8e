"""Headless Chromium for Olio's browser tests: the driver, explicit waits, the browser console
checked for errors, and a screenshot and the page source saved when a step fails.

Debian's `chromium` and `chromium-driver` (same version) are used by path, so Selenium Manager
never looks for (or downloads) a browser or driver.
"""

import contextlib
import re
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import TimeoutException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT_S = 60  # one CPU shared by the whole deployment on a noisy 2-core VM: generous, never slept
# Chromium's own requests that no Olio page makes: a 404 for them is not the page's fault.
IGNORED_URLS = re.compile(r"/favicon\.ico\b")


def chromium_options(width=1280, height=900):
    """Headless Chromium that runs as root, asks nothing of the network by itself, and keeps
    every console message for `Chromium.console_errors`."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     f"--window-size={width},{height}", "--lang=en-US", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--disable-default-apps", "--disable-extensions", "--hide-scrollbars"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return options


def start_chromium(width=1280, height=900):
    """A Chromium WebDriver; the caller quits it."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not path.exists():
            pytest.fail(f"{path} is missing: install Debian's {package} (scripts/setup.sh does)")
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=chromium_options(width, height))
    driver.set_page_load_timeout(WAIT_S)
    return driver


class StepFailed(AssertionError):
    pass


class Chromium:
    """One browser on one site, as a user sees it: pages by path, elements by CSS selector,
    waits for what should appear, and numbered steps that leave evidence when they fail."""

    def __init__(self, driver, url, evidence_dir):
        self.driver, self.url, self.evidence_dir = driver, url.rstrip("/"), Path(evidence_dir)
        self.steps = 0
        self.console = []  # entries read from the browser's log and not yet judged

    # ------------------------------------------------------------ steps and evidence

    @contextlib.contextmanager
    def step(self, name):
        """Run one user-visible step: on any failure (an assertion, a wait that timed out, an
        error in the page's JavaScript) save a screenshot and the page source and fail with
        their paths. The console is checked at the end of every step."""
        self.steps += 1
        label = f"{self.steps:02d}-{re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')}"
        try:
            yield
            errors = self.console_errors()
            assert not errors, "the browser console reported errors:\n" + "\n".join(errors)
        except StepFailed:
            raise
        except Exception as failure:
            saved = self.save_evidence(label)
            try:
                console = "\n".join(self.console_errors()) or "(no console errors)"
            except WebDriverException:
                console = "(console unreadable)"
            raise StepFailed(f"step {label!r} failed at {self.driver.current_url}: "
                             f"{type(failure).__name__}: {failure}\n{saved}\nconsole: {console}") from failure

    def save_evidence(self, label):
        self.evidence_dir.mkdir(parents=True, exist_ok=True)
        png, html = self.evidence_dir / f"{label}.png", self.evidence_dir / f"{label}.html"
        try:
            self.driver.save_screenshot(str(png))
            html.write_text(self.driver.page_source)
        except WebDriverException as e:
            return f"(no screenshot or page source: {e.msg})"
        return f"screenshot: {png}\npage source: {html}"

    def console_errors(self, allow=()):
        """SEVERE console entries since the last call (JavaScript exceptions, console.error,
        failed loads), except Chromium's own favicon request and the `allow` patterns."""
        self.console += self.driver.get_log("browser")
        entries, self.console = self.console, []
        found = []
        for entry in entries:
            message = entry["message"]
            if entry["level"] != "SEVERE" or IGNORED_URLS.search(message):
                continue
            if any(re.search(pattern, message) for pattern in allow):
                continue
            found.append(f"{entry['source']}: {message}")
        return found

    def console_shows(self, pattern):
        """Whether a console entry so far matches `pattern` (kept for `console_errors`)."""
        self.console += self.driver.get_log("browser")
        return any(re.search(pattern, entry["message"]) for entry in self.console)

    # ------------------------------------------------------------ navigation and reading

    def open(self, path):
        self.driver.get(self.url + path)
        return self.wait_for("h1")

    def path(self):
        current = self.driver.current_url
        assert current.startswith(self.url), f"left the site: {current}"
        return current[len(self.url):]

    def find(self, selector):
        return self.driver.find_element(By.CSS_SELECTOR, selector)

    def find_all(self, selector):
        return self.driver.find_elements(By.CSS_SELECTOR, selector)

    def text(self, selector):
        return self.find(selector).text

    def wait(self, condition, message):
        """Until `condition` holds. A check that fails because the page changed under it (a
        navigation replacing the document: "Node ... does not belong to the document", a stale
        element) is made again; the last such error is reported if the wait times out."""
        last = []

        def tolerant(driver):
            try:
                return condition(driver)
            except WebDriverException as e:
                last[:] = [e]
                return False

        try:
            return WebDriverWait(self.driver, WAIT_S).until(tolerant, message)
        except TimeoutException:
            if last:
                raise TimeoutException(f"{message} (last error: {last[0].msg})") from last[0]
            raise

    def wait_for(self, selector):
        """The element once it is visible."""
        return self.wait(EC.visibility_of_element_located((By.CSS_SELECTOR, selector)),
                         f"{selector} did not become visible within {WAIT_S} s")

    def wait_for_text(self, selector, text):
        self.wait(EC.text_to_be_present_in_element((By.CSS_SELECTOR, selector), text),
                  f"{selector} did not come to show {text!r} within {WAIT_S} s")
        return self.find(selector)

    def wait_for_path(self, pattern):
        """The match of `pattern` against the path once the browser is on such a page, and its
        h1 is there (the new page, not the old one, has loaded)."""
        self.wait(lambda d: re.fullmatch(pattern, self.path()) and d.execute_script(
            "return document.readyState") == "complete", f"no page matching {pattern!r} within {WAIT_S} s")
        self.wait_for("h1")
        return re.fullmatch(pattern, self.path())

    def image_loaded(self, element):
        """(naturalWidth, naturalHeight) of an <img> the browser loaded and decoded; (0, 0) if not."""
        self.wait(lambda d: d.execute_script("return arguments[0].complete", element),
                  f"the image {element.get_attribute('src')} did not finish loading")
        return tuple(self.driver.execute_script("return [arguments[0].naturalWidth, arguments[0].naturalHeight]", element))

    # ------------------------------------------------------------ forms

    def fill(self, values):
        """Type each value into the field with that id (file inputs get a path)."""
        for name, value in values.items():
            field = self.find(f"#{name}")
            if field.get_attribute("type") in ("date", "time"):
                # What one types into these depends on the browser's locale; a picker sets the
                # ISO value, as this does, and the change event follows.
                self.driver.execute_script(
                    "arguments[0].value = arguments[1];"
                    "arguments[0].dispatchEvent(new Event('input', {bubbles: true}));"
                    "arguments[0].dispatchEvent(new Event('change', {bubbles: true}));", field, value)
            else:
                if field.get_attribute("type") != "file":
                    field.clear()
                field.send_keys(str(value))
            if field.get_attribute("type") != "file":
                assert field.get_attribute("value") == str(value), f"#{name} holds {field.get_attribute('value')!r}"

    def submit(self, form_selector):
        """Press the form's button, as a user does."""
        self.find(f"{form_selector} button").click()
