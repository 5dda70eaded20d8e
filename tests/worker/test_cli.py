"""The operator's command line (docs/api.md, "Command line"): `sprout ls`, `show`, `rm`, `logs`,
`stats` and `sites`, the real binary against a real worker: text for people, `--json` as the API
gave it, the token found or given, errors with their status, code and request id, exit status 1
for an API error or a worker that cannot be reached."""

import json
import os
import queue
import re
import subprocess
import threading
import time
import urllib.request
import uuid

import pytest

from conftest import EXAMPLES, SPROUT, Worker, free_port, targz

PRINTER = """import sys


def f(event):
    print("hello from", event["who"])
    print("to stderr", event["who"], file=sys.stderr)
    return "ok"
"""

OL_YAML = "environment: {GREETING: hello}\n"


@pytest.fixture(scope="module")
def w(tmp_path_factory, sprout_bin):
    """A worker with an app port (one configured site, a.example) and echo deployed."""
    d = tmp_path_factory.mktemp("cli")
    static = d / "static"
    static.mkdir()
    (static / "hello.txt").write_text("static hello\n")
    app_port = free_port()
    worker = Worker(d / "worker", {"app": {"listen": f"127.0.0.1:{app_port}", "sites": {"a.example": {"lambda": "echo"}}}})
    worker.app_port, worker.static = app_port, static
    worker.start()
    worker.client.deploy(str(EXAMPLES / "echo"))
    worker.deploy_source("printer", PRINTER)
    yield worker
    worker.stop()
    assert worker.leftovers() == [], f"worker left {worker.leftovers()}"


def cli(w, *args, url=None, env=None, timeout=120):
    """Run `sprout ARGS` against `w` ($SPROUT_URL; the token found as a user's shell would)."""
    environment = {k: v for k, v in os.environ.items() if k not in ("SPROUT_TOKEN", "SPROUT_URL")}
    environment["SPROUT_URL"] = url or w.url
    environment.update(env or {})
    return subprocess.run([str(SPROUT), *map(str, args)], capture_output=True, text=True, timeout=timeout, env=environment)


def ok(out):
    assert out.returncode == 0, f"exit {out.returncode}\nstdout: {out.stdout}\nstderr: {out.stderr}"
    return out.stdout


def run(w, name, event):
    """POST /run/NAME; returns (reply, request id)."""
    request = urllib.request.Request(f"{w.url}/run/{name}", data=json.dumps(event).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read()), reply.headers.get("X-Sprout-Request-Id")


def table(text):
    """The rows of a table as lists of cells (cells split on runs of 2+ spaces), the header first."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.strip()]


def labelled(text):
    """`label  value` lines as {label: value}."""
    return dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in text.splitlines() if re.search(r"\S\s{2,}\S", line))


def wait_for(predicate, what, seconds=15):
    deadline = time.time() + seconds
    while True:
        value = predicate()
        if value:
            return value
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


# ---------------------------------------------------------------- ls, show, rm


def test_ls_lists_each_lambda_with_version_upload_time_sandboxes_and_invocations(w):
    w.deploy_source("cli-ls", "def f(event):\n    return event\n")
    version = w.deploy_source("cli-ls", "def f(event):\n    return [event]\n")["version"]
    for i in range(3):
        assert w.client.run("cli-ls", i) == [i]
    rows = table(ok(cli(w, "ls")))
    assert rows[0] == ["NAME", "VERSION", "UPLOADED", "BUSY/IDLE", "INVOCATIONS"]
    by_name = {row[0]: row for row in rows[1:]}
    assert set(by_name) == set(w.client.list())
    name, shown_version, uploaded, busy_idle, invocations = by_name["cli-ls"]
    assert shown_version == str(version) and re.fullmatch(r"just now|\d+s ago", uploaded), by_name["cli-ls"]
    assert re.fullmatch(r"0/1", busy_idle) and invocations == "3", by_name["cli-ls"]
    assert [row[0] for row in rows[1:]] == sorted(by_name)


def test_ls_json_is_the_apis_json(w):
    listed = json.loads(ok(cli(w, "ls", "--json")))
    assert [item["lambda"]["name"] for item in listed] == sorted(w.client.list())
    echo = next(item for item in listed if item["lambda"]["name"] == "echo")
    assert echo["lambda"] == w.client.get("echo")
    assert echo["stats"] is None or "sandboxes" in echo["stats"]


def test_show_gives_a_lambdas_metadata_config_and_figures(w):
    w.client.upload("cli-show", targz({"f.py": "def f(event):\n    return 1\n", "ol.yaml": OL_YAML}))
    w.client.run("cli-show")
    meta = w.client.get("cli-show")
    shown = labelled(ok(cli(w, "show", "cli-show")))
    assert shown["name"] == "cli-show" and shown["version"] == str(meta["version"]) and shown["sha256"] == meta["sha256"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \((just now|\d+s ago)\)", shown["uploaded"]), shown
    assert shown["files"].startswith(f"{meta['files']}, ") and "unpacked" in shown["files"]
    assert shown["config"] == 'environment: {"GREETING":"hello"}' and shown["requirements"] == "none"
    assert re.fullmatch(r"1 \(busy 0, idle 1\), queued 0", shown["sandboxes"]) and shown["served"] == "1", shown
    assert shown["keep-alive"].startswith(("histogram", "fixed")), shown
    as_json = json.loads(ok(cli(w, "show", "cli-show", "--json")))
    assert as_json["lambda"] == meta and as_json["stats"]["served"] == 1


def test_show_of_a_missing_lambda_is_an_error(w):
    out = cli(w, "show", "no-such-lambda")
    assert out.returncode == 1 and "404 lambda_not_found" in out.stderr and "no-such-lambda" in out.stderr, out.stderr
    assert out.stdout == ""


def test_rm_deletes_each_and_goes_on_past_failures(w):
    for name in ("cli-rm-a", "cli-rm-b", "cli-rm-c"):
        w.deploy_source(name, "def f(event):\n    return 1\n")
    assert ok(cli(w, "rm", "cli-rm-a", "cli-rm-b")) == "deleted cli-rm-a\ndeleted cli-rm-b\n"
    out = cli(w, "rm", "cli-rm-missing", "cli-rm-c")
    assert out.returncode == 1, out
    assert "cli-rm-missing" in out.stderr and "404 lambda_not_found" in out.stderr and out.stdout == "deleted cli-rm-c\n"
    assert not {"cli-rm-a", "cli-rm-b", "cli-rm-c"} & set(w.client.list())
    w.deploy_source("cli-rm-d", "def f(event):\n    return 1\n")
    assert json.loads(ok(cli(w, "rm", "cli-rm-d", "--json"))) == {"deleted": "cli-rm-d"}


# ---------------------------------------------------------------- stats


def test_stats_reads_as_one_liners(w):
    w.client.run("echo", 1)
    text = ok(cli(w, "stats"))
    lines = labelled(text)
    for label in ("worker", "invocations", "latency", "sandboxes", "memory budget", "handler cache", "install cache", "import cache",
                  "errors"):
        assert label in lines, f"{label} missing:\n{text}"
    total, cold, warm = map(int, re.fullmatch(r"(\d+) \(cold (\d+), warm (\d+)\)", lines["invocations"]).groups())
    assert total >= 1 and total == cold + warm
    assert re.search(r"p50 [\d.]+ ms, p99 [\d.]+ ms", lines["latency"])
    assert lines["worker"].startswith("sock backend, up ")
    stats = json.loads(ok(cli(w, "stats", "--json")))
    assert stats["invocations"] >= total and "per_lambda" in stats["lambdas"]


# ---------------------------------------------------------------- sites


def test_sites_are_listed_added_replaced_and_removed(w):
    rows = table(ok(cli(w, "sites", "ls")))
    assert rows[0] == ["HOST", "LAMBDA", "SOURCE", "STATIC"] and ["a.example", "echo", "config", "-"] in rows[1:]
    out = ok(cli(w, "sites", "put", "c.example", "--lambda", "echo", "--static", f"/s/={w.static}"))
    assert out == f"added site c.example: echo, static /s/ → {w.static}\n"
    request = urllib.request.Request(f"http://127.0.0.1:{w.app_port}/s/hello.txt", headers={"Host": "c.example"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert reply.read() == b"static hello\n"
    assert ["c.example", "echo", "api", f"/s/ → {w.static}"] in table(ok(cli(w, "sites", "ls")))
    assert ok(cli(w, "sites", "put", "c.example", "--lambda", "printer")) == "replaced site c.example: printer\n"
    listed = json.loads(ok(cli(w, "sites", "ls", "--json")))
    assert listed["c.example"] == {"site": {"lambda": "printer"}, "source": "api"} and listed == w.client.sites()
    assert ok(cli(w, "sites", "rm", "c.example")) == "removed site c.example\n"
    again = cli(w, "sites", "rm", "c.example")
    assert again.returncode == 1 and "404 site_not_found" in again.stderr, again.stderr
    refused = cli(w, "sites", "put", "a.example", "--lambda", "printer", "--json")
    assert refused.returncode == 1 and "400 invalid_request" in refused.stderr and refused.stdout == ""
    put = json.loads(ok(cli(w, "sites", "put", "d.example", "--lambda", "echo", "--json")))
    assert put["host"] == "d.example" and put["site"]["lambda"] == "echo", put
    assert json.loads(ok(cli(w, "sites", "rm", "d.example", "--json"))) == {"deleted": "d.example"}


def test_a_static_argument_without_a_directory_is_a_usage_error(w):
    out = cli(w, "sites", "put", "e.example", "--lambda", "echo", "--static", "/s/")
    assert out.returncode == 2 and "/prefix/=/directory" in out.stderr, out.stderr


# ---------------------------------------------------------------- the token, the worker's address


def test_a_wrong_token_is_403_forbidden(w):
    for args, env in [(("--token", "0" * 64), None), ((), {"SPROUT_TOKEN": "1" * 64})]:
        for verb in (["ls"], ["show", "echo"], ["stats"], ["sites", "ls"], ["logs", "echo"], ["rm", "echo"]):
            out = cli(w, *verb, *args, env=env)
            assert out.returncode == 1 and "403 forbidden" in out.stderr, (verb, out.stderr)
    assert "echo" in w.client.list()


def test_the_given_token_is_used(w):
    token = (w.dir / "api-token").read_text().strip()
    assert "echo" in ok(cli(w, "ls", "--token", token))
    assert "echo" in ok(cli(w, "ls", env={"SPROUT_TOKEN": token}))


def test_an_unreachable_worker_is_one_line_naming_its_url(w):
    url = f"http://127.0.0.1:{free_port()}"
    for verb in (["ls"], ["show", "echo"], ["rm", "echo"], ["stats"], ["sites", "ls"], ["logs", "echo"], ["logs", "echo", "-f"]):
        out = cli(w, *verb, "--url", url, "--token", "0" * 64)
        assert out.returncode == 1 and out.stdout == "", (verb, out)
        first = out.stderr.strip().splitlines()[0]
        assert f"cannot reach the worker at {url}" in first, (verb, out.stderr)
    out = cli(w, "stats", url=url)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and url in out.stderr, out.stderr


def test_api_errors_name_the_request_id(w):
    out = cli(w, "show", "no-such-lambda")
    assert out.returncode == 1
    assert re.search(r'404 lambda_not_found: no lambda named "no-such-lambda" \(request [0-9a-f]{16}\)', out.stderr), out.stderr


# ---------------------------------------------------------------- logs


def invoke_printer(w):
    """Run the printer with a fresh marker; returns (marker, request id)."""
    marker = f"m{uuid.uuid4().hex[:12]}"
    reply, request_id = run(w, "printer", {"who": marker})
    assert reply == "ok"
    assert request_id and re.fullmatch(r"[0-9a-f]{16}", request_id), request_id
    return marker, request_id


def logs_with(w, *args, needle):
    """`sprout logs printer ARGS` once its output holds `needle` (logs arrive asynchronously)."""
    return wait_for(lambda: (lambda out: out if needle in out else None)(ok(cli(w, "logs", "printer", *args))), f"{needle!r} in logs")


def test_logs_show_a_requests_lines_framed_by_start_and_report(w):
    marker, rid = invoke_printer(w)
    text = logs_with(w, needle=f"REPORT RequestId: {rid}")
    lines = text.splitlines()
    time_ = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"

    def at(pattern):
        return [i for i, line in enumerate(lines) if re.fullmatch(rf"{time_} {pattern}", line)]

    hello, stderr = at(rf"{rid[:8]} hello from {marker}"), at(rf"{rid[:8]} to stderr {marker}")
    start = at(rf"START RequestId: {rid} Version: \d+")
    report = at(rf"REPORT RequestId: {rid} Duration: [\d.]+ ms Billed Duration: \d+ ms Max Memory Used: .*")
    assert len(hello) == len(stderr) == len(start) == len(report) == 1, text
    assert start[0] < hello[0] < report[0] and start[0] < stderr[0] < report[0], text


def test_logs_of_one_request(w):
    first, rid = invoke_printer(w)
    second, _ = invoke_printer(w)
    logs_with(w, needle=second)
    text = ok(cli(w, "logs", "printer", "--request", rid))
    assert first in text and second not in text and f"REPORT RequestId: {rid}" in text, text
    for line in text.splitlines():
        assert rid[:8] in line, line


def test_logs_json_limit_and_since(w):
    marker, rid = invoke_printer(w)
    logs_with(w, needle=f"REPORT RequestId: {rid}")
    reply = json.loads(ok(cli(w, "logs", "printer", "--json")))
    assert reply["lambda"] == "printer" and isinstance(reply["entries"], list) and "lines" in reply["dropped"]
    mine = [e for e in reply["entries"] if e["request_id"] == rid]
    assert [e["type"] for e in mine][0] == "start" and [e["type"] for e in mine][-1] == "report", mine
    assert any(e["type"] == "out" and e["message"] == f"hello from {marker}" for e in mine), mine
    newest = ok(cli(w, "logs", "printer", "--limit", "1")).splitlines()
    assert len(newest) == 1 and f"REPORT RequestId: {rid}" in newest[0], newest
    assert marker in ok(cli(w, "logs", "printer", "--since", "10m"))
    assert ok(cli(w, "logs", "printer", "--since", str(int(time.time()) + 3600))) == ""
    bad = cli(w, "logs", "printer", "--since", "yesterday-ish")
    assert bad.returncode == 1 and "400 invalid_request" in bad.stderr, bad.stderr


def test_logs_of_a_missing_lambda_is_404(w):
    out = cli(w, "logs", "no-such-lambda")
    assert out.returncode == 1 and "404 lambda_not_found" in out.stderr, out.stderr


def test_logs_follow_streams_what_later_requests_print(w):
    invoke_printer(w)
    environment = {k: v for k, v in os.environ.items() if k not in ("SPROUT_TOKEN", "SPROUT_URL")}
    follower = subprocess.Popen([str(SPROUT), "logs", "printer", "-f", "--url", w.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=environment)
    lines = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in follower.stdout], daemon=True)
    reader.start()
    try:
        seen = []

        def until(needle, seconds=20):
            deadline = time.time() + seconds
            while time.time() < deadline:
                try:
                    line = lines.get(timeout=0.5)
                except queue.Empty:
                    assert follower.poll() is None, f"sprout logs -f ended ({follower.returncode}): {follower.stderr.read()}"
                    continue
                seen.append(line)
                if needle in line:
                    return line
            raise AssertionError(f"{needle!r} not streamed; got {seen}")

        until("REPORT RequestId")  # the backlog
        marker, rid = invoke_printer(w)
        assert until(f"hello from {marker}").split()[1] == rid[:8]
        until(f"REPORT RequestId: {rid}")
        assert follower.poll() is None
    finally:
        follower.terminate()
        follower.wait(timeout=10)
