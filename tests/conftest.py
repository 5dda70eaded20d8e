"""Test helpers: they start real workers (the release `sprout` binary, as root, with real
sandboxes on the real base image) and stop them, checking that nothing is left behind.

A worker is started per test module with the defaults, or per test with settings of its own
(``make_worker(limits={"timeout_ms": 500})``). Each gets its own directory, port and cgroup
names, so tests never share state.
"""

import hashlib
import io
import ipaddress
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

# Run in parallel (scripts/test.sh: pytest-xdist), each test process takes its ports from a
# range of its own (sprout.net.free_port), and so do the deployments it starts: two processes
# never pick the same free port at once: 12000-31999, above memcached's 11211 and below the
# kernel's ephemeral ports (32768 and up).
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    _n = int(os.environ["PYTEST_XDIST_WORKER"][2:]) % 10
    os.environ["SPROUT_PORTS"] = f"{12000 + 2000 * _n}-{13999 + 2000 * _n}"

import sprout  # noqa: E402
from sprout.net import free_port  # noqa: E402,F401  (imported by the tests from here)
from toml_sections import to_toml  # noqa: E402,F401  (worker settings, inline tables included)
from wheels import make_wheel, module  # noqa: E402

# The fixtures of the cache servers and of Olio's sites, for every test module.
pytest_plugins = ["cache_servers", "olio_fixtures"]

SPROUT = Path(os.environ.get("SPROUT_BIN", ROOT / "target" / "release" / "sprout"))
EXAMPLES = ROOT / "examples" / "lambdas"
LAMBDAS = Path(__file__).resolve().parent / "lambdas"


def mounts_under(path):
    path = str(path)
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(path)]


def cgroup_dirs(name):
    found = []
    for root in Path("/sys/fs/cgroup").iterdir():
        if (root / name).exists():
            found.append(root / name)
    unified = Path("/sys/fs/cgroup/unified") / name
    if unified.exists():
        found.append(unified)
    return found


def network_leftovers(tag, directory=None):
    """Host interfaces, the nftables table and the address-block routes of the worker tagged
    `tag` (and its claim file in `directory`) that exist."""
    left = [f"link {n}" for n in os.listdir("/sys/class/net") if n.startswith(f"sb{tag}-")]
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    if f"sprout_{tag}" in tables:
        left.append(f"nftables table sprout_{tag}")
    claim = Path(directory) / "network.json" if directory else None
    if claim and claim.exists():
        block = json.loads(claim.read_text())["block"]
        left.append(f"claim {block}")
        ours = ipaddress.ip_network(block)
        routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
        for line in routes.splitlines():
            words = line.split()
            dst = words[1] if words[0] in ("local", "blackhole", "broadcast", "unreachable") else words[0]
            if dst != "default" and ours.overlaps(ipaddress.ip_network(dst, strict=False)):
                left.append(f"route {line}")
    return left


def targz(files):
    """A tar.gz of {name: bytes or str}."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            data = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def api_request(worker, method, path, body=None, token=True):
    """(status, body) of one request to `worker`'s API, with its token unless `token` is
    False; urllib's errors for a connection the worker closed."""
    req = urllib.request.Request(worker.url + path, data=body, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {worker.client.token().strip()}")
    try:
        with urllib.request.urlopen(req, timeout=60) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


ALL_WORKERS = []


class Worker:
    def __init__(self, directory, settings):
        ALL_WORKERS.append(self)
        self.dir = Path(directory)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        sections = {"worker": {"listen": f"127.0.0.1:{self.port}", "name": f"t{self.port}"}}
        for section, values in (settings or {}).items():
            sections.setdefault(section, {}).update(values)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.toml").write_text(to_toml(sections))
        self.cgroup_names = [f"sprout-t{self.port}", f"sprout-t{self.port}-runc"]
        self.client = sprout.Client(self.url, timeout=60)
        self.process = None
        self.log_path = self.dir / "test-worker.log"

    def sprout(self, *args, check=True, timeout=300):
        return subprocess.run([str(SPROUT), *map(str, args)], capture_output=True, text=True, check=check, timeout=timeout)

    def start(self):
        self.sprout("worker", "init", self.dir)
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen([str(SPROUT), "worker", "up", str(self.dir)], stdout=log, stderr=log)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited ({self.process.returncode}):\n{self.log()}")
            try:
                if self.client.status() == "ready\n":
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"worker did not start:\n{self.log()}")

    def log(self):
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise
        self.process = None

    @property
    def network_tag(self):
        """Names the worker's nftables table and host interfaces (config.rs, network_tag)."""
        return hashlib.sha256(f"t{self.port}".encode()).hexdigest()[:6]

    def network_leftovers(self, wait=5.0):
        """The worker's host interfaces, nftables table and routes that still exist. A
        namespace's link goes with its last process, which the kernel finishes a moment
        later: wait up to `wait` seconds for that."""
        deadline = time.time() + wait
        while True:
            left = network_leftovers(self.network_tag, self.dir)
            if not left or time.time() > deadline:
                return left
            time.sleep(0.1)

    def leftovers(self):
        """Mounts, cgroups and network of this worker that still exist (v1 and v2 hierarchies)."""
        left = mounts_under(self.dir)
        for name in self.cgroup_names:
            left += [str(d) for d in cgroup_dirs(name)]
        return left + self.network_leftovers()

    def deploy_source(self, name, source, **extra_files):
        return self.client.upload(name, targz({"f.py": source, **extra_files}))

    def deploy_test_lambda(self, name):
        return self.client.deploy(str(LAMBDAS / name), name=name)


def root_zygote_pid(w):
    """The root Zygote's pid: the process of its cgroup whose parent is not in it (a spare it
    has just forked is there too until it moves to its sandbox's group)."""
    pids = open(f"/sys/fs/cgroup/pids/{w.cgroup_names[0]}/zygote-0/cgroup.procs").read().split()
    roots = []
    for pid in pids:
        try:
            parent = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]
        except FileNotFoundError:
            continue
        if parent not in pids:
            roots.append(pid)
    assert len(roots) == 1, (pids, roots)
    return roots[0]


# The test modules that take longest, slowest first (measured 2026-12-02, one process): run in
# parallel, each module in one process, the suite ends when the last module started does, so
# these go first and the short ones fill in around them.
SLOWEST_MODULES = [
    "cloudstone/test_fleet.py",
    "fleet/test_fleet_workers.py",
    "cloudstone/test_cloudstone.py",
    "worker/test_openlambda.py",
    "olio/test_olio_browser.py",
    "worker/test_import_cache.py",
    "olio/test_fleet_ondemand.py",
    "worker/test_kafka.py",
    "worker/test_console.py",
    "worker/test_gvisor.py",
    "olio/test_fleet_deploy.py",
    "worker/test_lifecycle.py",
]


def pytest_collection_modifyitems(session, config, items):
    """The slowest modules first, each module's tests in their own order."""
    rank = {name: i for i, name in enumerate(SLOWEST_MODULES)}
    tests = Path(__file__).resolve().parent

    def module_rank(item):
        try:
            return rank.get(str(Path(item.fspath).resolve().relative_to(tests)), len(rank))
        except ValueError:
            return len(rank)

    items.sort(key=module_rank)


@pytest.fixture(scope="session", autouse=True)
def no_worker_outlives_the_session():
    """Even when a test fails half-way, stop its workers and remove their mounts and cgroups,
    so that nothing of one run is left on the machine."""
    yield
    for w in ALL_WORKERS:
        try:
            w.stop()
        except Exception:
            pass
        if w.leftovers():
            w.sprout("worker", "cleanup", w.dir, check=False)


@pytest.fixture(scope="session")
def sprout_bin():
    if not SPROUT.exists():
        pytest.fail(f"{SPROUT} is missing: run `cargo build --release` first (scripts/test.sh does)")
    return SPROUT


@pytest.fixture
def make_worker(tmp_path_factory, sprout_bin):
    """Start a worker with its own settings; stopped (and checked for leftovers) afterwards."""
    started = []

    def make(**settings):
        w = Worker(tmp_path_factory.mktemp("worker"), settings)
        started.append(w)
        return w.start()

    yield make
    for w in started:
        w.stop()
        assert w.leftovers() == [], f"worker left {w.leftovers()}\n{w.log()[-3000:]}"


@pytest.fixture(scope="module")
def worker(tmp_path_factory, sprout_bin):
    """A worker with the default settings, shared by the tests of a module."""
    w = Worker(tmp_path_factory.mktemp("worker"), {})
    w.start()
    for example in ("echo", "hello", "fail"):
        w.client.deploy(str(EXAMPLES / example))
    yield w
    w.stop()
    assert w.leftovers() == [], f"worker left {w.leftovers()}"


# ---------------------------------------------------------------- packages

PROBE = """
import sys
PRELOADED = sorted(m for m in list(sys.modules) if m.split(".")[0] in ("alpha", "beta", "gamma", "bigpkg", "evil"))
{imports}

def f(event):
    import importlib
    out = {{"preloaded": PRELOADED, "paths": [p for p in sys.path if p.startswith("/packages")]}}
    for name in (event or {{}}).get("try", []):
        try:
            importlib.import_module(name)
            out[name] = True
        except ImportError:
            out[name] = False
    if "beta" in sys.modules:
        out["beta2"] = hasattr(sys.modules["beta"], "VERSION2")
    return out
"""


def probe(imports=()):
    """Source of a lambda reporting which test packages it sees and which were imported
    before its f.py ran (by the Zygote it was forked from)."""
    return PROBE.format(imports="\n".join(f"import {m}" for m in imports))


@pytest.fixture(scope="session")
def wheel_dir(tmp_path_factory):
    """Wheels of small test packages: alpha 1.0 (needs beta >= 1; has alpha.sub, and alpha.slow,
    which takes 2 s to import), beta 1.0
    and 2.0, gamma 1.0, bigpkg 1.0 (3 MiB on disk)."""
    d = tmp_path_factory.mktemp("wheels")
    make_wheel(d, "alpha", "1.0", {**module("alpha", deps=["beta"]), "alpha/sub.py": "SUB = True\n",
                                        "alpha/slow.py": "import time\ntime.sleep(2)\nSLOW = True\n"}, requires=["beta>=1.0"])
    make_wheel(d, "beta", "1.0", module("beta"))
    make_wheel(d, "beta", "2.0", module("beta", "VERSION2 = True"))
    make_wheel(d, "gamma", "1.0", module("gamma"))
    make_wheel(d, "bigpkg", "1.0", {**module("bigpkg"), "bigpkg/data.bin": os.urandom(3 << 20)})
    d.chmod(0o755)  # pip reads it as the sandbox user
    return d


def offline(wheel_dir, **sections):
    """Worker settings that install packages only from `wheel_dir`, plus `sections`."""
    settings = {"packages": {"wheel_dir": str(wheel_dir), "offline": True}}
    for name, values in sections.items():
        settings.setdefault(name, {}).update(values)
    return settings


def deploy_with(worker, name, source, requirements):
    return worker.client.upload(name, targz({"f.py": source, "requirements.txt": requirements}))


def zygote_nodes(stats):
    """Every node of the import cache's tree, flattened."""
    out, stack = [], [stats["import_cache"]["tree"]]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node["children"])
    return out


# ---------------------------------------------------------------- sprout.store

STORE_BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server (Debian's), started for the session and stopped after."""
    from sprout.store.pgserver import TempPostgres

    server = TempPostgres().start()
    yield server
    server.stop()


_databases = iter(range(1, 1 << 30))


@pytest.fixture(params=STORE_BACKENDS)
def store_url(request, tmp_path):
    """A fresh, empty database of each backend (the test runs once per backend)."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path}/store.db"
    return request.getfixturevalue("postgres").create_database(f"t{next(_databases)}")


@pytest.fixture
def db(store_url):
    import sprout.store as store

    database = store.open(store_url)
    yield database
    database.close()
