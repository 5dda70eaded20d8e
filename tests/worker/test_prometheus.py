"""A real Prometheus against a real worker: `promtool check metrics` accepts `/metrics`, and
Debian's Prometheus server, scraping it every second with the worker's API token, sees each
lambda's invocations by start and outcome, the cold starts and the worker's memory, as time
series it can query. Without the token the scrape is refused, the target down with a 401
(with a wrong token, a 403)."""

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from conftest import EXAMPLES, free_port

BUDGET_MB = 512
DEADLINE_S = 60


def token_of(worker):
    return (worker.dir / "api-token").read_text().strip()


def fetch_metrics(worker):
    """`/metrics` as a scraper gets it: the worker's token as a Bearer credential."""
    request = urllib.request.Request(worker.url + "/metrics", headers={"Authorization": f"Bearer {token_of(worker)}"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4"), reply.headers["Content-Type"]
        return reply.read().decode()


def invoke(worker, name, event=1):
    """POST `event` to lambda `name`; returns (start, outcome) as the worker counts them: the
    reply's X-Sprout-Start, and "ok" or the error code of a failed handler."""
    reply = worker.client._call("POST", f"/run/{name}", json.dumps(event).encode(), {"Content-Type": "application/json"})
    outcome = "ok" if reply.status == 200 else json.loads(reply.body)["error"]
    return reply.headers["X-Sprout-Start"], outcome


def poll(what, probe, done, seconds=DEADLINE_S):
    """probe() until done(its value); fails after `seconds` saying what was last seen."""
    deadline = time.monotonic() + seconds
    while True:
        seen = probe()
        if done(seen):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds} s; last seen: {seen!r}")
        time.sleep(0.25)


class Prometheus:
    """Debian's Prometheus server on a free loopback port, its config and TSDB in `directory`,
    scraping `jobs` ({job name: (worker, scrape settings)}) every second."""

    def __init__(self, directory, jobs):
        self.dir = directory
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        scrape_configs = [
            {
                "job_name": job,
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [f"127.0.0.1:{worker.port}"]}],
                **settings,
            }
            for job, (worker, settings) in jobs.items()
        ]
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": scrape_configs}
        self.config = directory / "prometheus.yml"
        self.config.write_text(json.dumps(config, indent=2))  # JSON is YAML
        self.log_path = directory / "prometheus.log"
        self.process = None

    def start(self):
        check = subprocess.run(["promtool", "check", "config", str(self.config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=log,
            )
        poll("Prometheus ready", self.ready, bool)
        return self

    def log(self):
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def _get(self, path):
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited ({self.process.returncode}):\n{self.log()}")
        with urllib.request.urlopen(self.url + path, timeout=10) as reply:
            return reply.read()

    def ready(self):
        try:
            return self._get("/-/ready").startswith(b"Prometheus Server is Ready")
        except OSError:
            return False

    def api(self, path, **params):
        reply = json.loads(self._get(f"/api/v1/{path}?{urllib.parse.urlencode(params)}"))
        assert reply["status"] == "success", reply
        return reply["data"]

    def query(self, expr):
        """An instant query's vector: [(labels without __name__, value)]."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return [({k: v for k, v in r["metric"].items() if k != "__name__"}, float(r["value"][1])) for r in data["result"]]

    def target(self, job):
        """The scrape target of `job` as /api/v1/targets shows it (health, lastError, ...)."""
        targets = [t for t in self.api("targets", state="active")["activeTargets"] if t["labels"]["job"] == job]
        return targets[0] if targets else None


@pytest.fixture
def prometheus(tmp_path_factory):
    """Start Prometheus servers (`prometheus(jobs)`), stopped at the end even when the test
    fails; their log is shown with a failure."""
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        pytest.fail("Debian's prometheus package is missing: run scripts/setup.sh")
    started = []

    def start(jobs):
        server = Prometheus(tmp_path_factory.mktemp("prometheus"), jobs)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


def bearer(worker):
    return {"authorization": {"type": "Bearer", "credentials_file": str(worker.dir / "api-token")}}


def wait_until_up(server, job):
    target = poll(f"target {job} up", lambda: server.target(job), lambda t: t and t["health"] == "up")
    assert target["lastError"] == "", target
    return target


def test_promtool_accepts_the_metrics_with_every_labelled_series(worker):
    assert invoke(worker, "echo") == ("cold", "ok")
    assert invoke(worker, "echo") == ("warm", "ok")
    assert invoke(worker, "fail")[1] == "handler_exception"
    assert worker.client._call("POST", "/run/nosuchlambda", b"1").status == 404
    text = fetch_metrics(worker)
    for series in (
        'sprout_invocations_total{lambda="echo",start="cold",outcome="ok"} ',
        'sprout_invocations_total{lambda="echo",start="warm",outcome="ok"} ',
        'sprout_invocations_total{lambda="fail",start="cold",outcome="handler_exception"} ',
        'sprout_errors_total{kind="lambda_not_found"} ',
        'sprout_request_duration_seconds_bucket{le="+Inf",start="warm"} ',
        'sprout_lambda_sandboxes{lambda="echo",state="idle"} ',
        "sprout_cold_starts_total ",
    ):
        assert series in text, series
    # Served as Prometheus's text format 0.0.4: a counter's HELP and TYPE name its samples.
    assert "# TYPE sprout_invocations_total counter\n" in text and "# EOF" not in text
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert (check.returncode, check.stdout + check.stderr) == (0, ""), text


def test_prometheus_scrapes_invocations_cold_starts_and_memory(make_worker, prometheus):
    # Under a memory budget the worker reports the memory its sandboxes, Zygotes and spares
    # hold (sprout_memory_budget_used_bytes), beside the budget: the figure to alert on.
    w = make_worker(instances={"memory_budget_mb": BUDGET_MB})
    for example in ("echo", "fail"):
        w.client.deploy(str(EXAMPLES / example))
    server = prometheus({"sprout": (w, bearer(w))})
    wait_until_up(server, "sprout")
    # A scrape has seen no cold start yet: the counter's rise is then in Prometheus's range.
    zero = poll("sprout_cold_starts_total scraped", lambda: server.query("sprout_cold_starts_total"), bool)
    assert zero == [({"instance": f"127.0.0.1:{w.port}", "job": "sprout"}, 0.0)], zero

    made = {}
    for name, times in (("echo", 4), ("fail", 2)):
        for i in range(times):
            start, outcome = invoke(w, name, i)
            assert start == ("cold" if i == 0 else "warm"), (name, i, start)
            made[(name, start, outcome)] = made.get((name, start, outcome), 0) + 1
    assert made == {
        ("echo", "cold", "ok"): 1,
        ("echo", "warm", "ok"): 3,
        ("fail", "cold", "handler_exception"): 1,
        ("fail", "warm", "handler_exception"): 1,
    }

    def invocations():
        return {(m["lambda"], m["start"], m["outcome"]): v for m, v in server.query("sprout_invocations_total")}

    poll("sprout_invocations_total as made", invocations, lambda seen: seen == made)
    cold = poll("sprout_cold_starts_total", lambda: server.query("sprout_cold_starts_total"), lambda s: s and s[0][1] >= 2)
    assert cold[0][1] == 2, cold
    # As time series: the counter went from 0 to 2 within the last minutes. increase()
    # extrapolates to the window's end, so it is at least the 2 cold starts made.
    span = server.query("max_over_time(sprout_cold_starts_total[5m]) - min_over_time(sprout_cold_starts_total[5m])")
    assert [v for _, v in span] == [2.0], span
    increase = server.query("increase(sprout_cold_starts_total[5m])")
    assert len(increase) == 1 and increase[0][1] >= 2.0, increase
    rate = server.query("rate(sprout_cold_starts_total[5m])")
    assert len(rate) == 1 and rate[0][1] > 0, rate

    # The worker's memory: more than nothing, within the budget.
    used = poll(
        "sprout_memory_budget_used_bytes / sprout_memory_budget_bytes",
        lambda: server.query("sprout_memory_budget_used_bytes / sprout_memory_budget_bytes"),
        lambda s: s and s[0][1] > 0,
    )
    assert 0 < used[0][1] <= 1, used
    assert server.query("sprout_memory_budget_bytes")[0][1] == BUDGET_MB << 20
    # And the idle sandboxes', paused in the handler cache once idle: their PSS.
    poll(
        "sprout_handler_cache_pss_bytes > 0",
        lambda: server.query("sprout_handler_cache_pss_bytes"),
        lambda s: s and s[0][1] > 0,
    )
    # Every series came typed from the scrape (counters as counters), as /metrics declares.
    metadata = server.api("metadata")
    types = {name: entries[0]["type"] for name, entries in metadata.items()}
    assert types.get("sprout_invocations_total") == "counter", types.get("sprout_invocations_total")
    assert types.get("sprout_memory_budget_used_bytes") == "gauge", types
    assert types.get("sprout_request_duration_seconds") == "histogram", types


def test_a_scrape_without_the_token_is_refused(worker, prometheus, tmp_path):
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-token\n")
    server = prometheus(
        {
            "no-token": (worker, {}),
            "wrong-token": (worker, {"authorization": {"type": "Bearer", "credentials_file": str(wrong)}}),
            "token": (worker, bearer(worker)),
        }
    )
    wait_until_up(server, "token")
    # No credentials: 401 unauthorized; a wrong token: 403 forbidden (docs/api.md).
    for job, status in (("no-token", "401 Unauthorized"), ("wrong-token", "403 Forbidden")):
        target = poll(f"target {job} down", lambda job=job: server.target(job), lambda t: t and t["health"] == "down")
        assert target["lastError"] == f"server returned HTTP status {status}", target
    up = {m["job"]: v for m, v in server.query("up")}
    assert up == {"no-token": 0.0, "wrong-token": 0.0, "token": 1.0}, up
