"""Take the README's picture of Olio: its home page, served by the Sprout deployment from a
loaded database, as headless Chromium shows it.

    PYTHONPATH=python:apps/olio python3 apps/olio/screenshot.py docs/olio-home.png

It brings the Sprout deployment up (olio_deploy: the Olio lambda behind a worker's app port,
the Sprout cache, PostgreSQL, on CPU 0) in a fresh state directory under /tmp, loaded by the
loader with 1,000 users and seed 1 (`--users`, `--seed`), opens the home page in a
1280x900 viewport (`--width`, `--height`), waits until every image on it has loaded, saves
the PNG and takes the deployment down, whatever happened. It fails (exit status 1, nothing
written) if the page does not show events, their thumbnails and the tag cloud, or if the
browser console reports an error. Needs root (the deployment), Debian's `chromium` and
`chromium-driver`, and pip's `selenium` (scripts/setup.sh installs them).
"""

import argparse
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
WAIT_S = 120


def chromium(width, height):
    """Headless Chromium (Debian's, with its own driver: Selenium Manager stays out of it)
    whose viewport is exactly width x height."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--lang=en-US",
                     f"--window-size={width},{height}", "--hide-scrollbars", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    driver.set_page_load_timeout(WAIT_S)
    return driver


def photograph(url, out, width, height):
    """Open `url`, check that it shows what the picture is for, save it as PNG `out`."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium(width, height)
    try:
        driver.get(url)
        WebDriverWait(driver, WAIT_S).until(
            lambda d: d.execute_script("return document.readyState === 'complete' && "
                                       "Array.from(document.images).every(i => i.complete)"),
            "the page's images did not finish loading")
        seen = driver.execute_script("""
            const thumbs = Array.from(document.querySelectorAll('li.event img.thumb'));
            return {events: thumbs.length,
                    thumbnails: thumbs.filter(i => i.naturalWidth > 0 && i.src.includes('/files/')).length,
                    broken: Array.from(document.images).filter(i => i.naturalWidth === 0).map(i => i.src),
                    tags: document.querySelectorAll('#tag-cloud a.tag').length};""")
        errors = [e["message"] for e in driver.get_log("browser")
                  if e["level"] == "SEVERE" and "/favicon.ico" not in e["message"]]
        problems = [text for text, bad in (
            ("no events listed", seen["events"] == 0),
            ("no event shows a thumbnail from the file store", seen["thumbnails"] == 0),
            (f"images that did not load: {seen['broken']}", seen["broken"]),
            ("no tag cloud", seen["tags"] == 0),
            (f"browser console errors: {errors}", errors)) if bad]
        if problems:
            raise RuntimeError(f"{url} does not look right: " + "; ".join(problems))
        out.parent.mkdir(parents=True, exist_ok=True)
        if not driver.save_screenshot(str(out)):
            raise RuntimeError(f"Chromium could not write {out}")
        return seen
    finally:
        driver.quit()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="the PNG to write (e.g. docs/olio-home.png)")
    parser.add_argument("--users", type=int, default=1000, help="users the loader makes (default 1,000)")
    parser.add_argument("--seed", type=int, default=1, help="the loader's seed (default 1)")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=900)
    args = parser.parse_args(argv)
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not Path(path).exists():
            parser.error(f"{path} is missing: apt-get install {package} (scripts/setup.sh does)")
    if importlib.util.find_spec("selenium") is None:
        parser.error("selenium is missing: python3 -m pip install selenium (scripts/setup.sh does)")

    import olio_deploy

    out = args.out.resolve()
    state = Path(tempfile.mkdtemp(prefix="olio-screenshot-", dir="/tmp"))
    state.chmod(0o755)  # PostgreSQL and the sandboxes pass through it
    try:
        with olio_deploy.running("sprout", state / "state", cpus="0", cache=True, users=args.users, seed=args.seed,
                                 allow_small=args.users < 1000) as site:
            seen = photograph(site.url + "/", out, args.width, args.height)
    except (olio_deploy.DeployError, RuntimeError) as e:
        print(f"screenshot: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(state, ignore_errors=True)
    print(f"wrote {out} ({args.width}x{args.height}: {seen['events']} events, {seen['thumbnails']} thumbnails, "
          f"{seen['tags']} tags in the cloud)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
