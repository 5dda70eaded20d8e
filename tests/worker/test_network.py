"""Each lambda's network of its own: what a sandbox can reach (only the services its worker
allows it, by name), what it cannot (the worker's API, every other address of the host, other
lambdas, the outside world) and how fast it is told so; connection limits; services on other
hosts; namespaces per lambda, kept and given back; nothing left after a kill -9."""

import json
import socket
import subprocess
import threading
import time

import pytest

from conftest import SPROUT, Worker, network_leftovers

# Tries each target and says what happened and how long it took.
PROBE = '''
import json, os, socket, time

def attempt(host, port, proto):
    began = time.perf_counter()
    try:
        if proto == "udp":
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.settimeout(2)
                s.connect((host, port))  # connected: an ICMP error comes back as an error
                s.send(b"ping")
                outcome = "ok " + s.recv(100).decode()
        else:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.settimeout(3)
                s.connect((host, port))
                s.sendall(b"ping")
                outcome = "ok " + s.recv(100).decode()
    except OSError as e:
        outcome = type(e).__name__ + ": " + (e.strerror or str(e))
    return {"outcome": outcome, "ms": (time.perf_counter() - began) * 1000}

def f(event):
    import sprout
    out = {"services": sprout.services(), "env": {k: v for k, v in os.environ.items() if k.startswith("SPROUT_SERVICE_")},
           "netns": os.readlink("/proc/self/ns/net"), "links": open("/proc/net/dev").read().split("\\n")[2:]}
    out["tries"] = [attempt(h, p, proto) for h, p, proto in event.get("targets", [])]
    return out
'''


class EchoServer:
    """A TCP (or UDP) server on the host that answers "pong <name>" to anything."""

    def __init__(self, name, host="127.0.0.1", udp=False):
        self.name = name
        kind = socket.SOCK_DGRAM if udp else socket.SOCK_STREAM
        self.sock = socket.socket(socket.AF_INET, kind)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.address = self.sock.getsockname()
        self.connections = []
        self.peers = []  # where each connection came from
        if not udp:
            self.sock.listen(256)
        threading.Thread(target=self._serve_udp if udp else self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.connections.append(conn)
            self.peers.append(peer[0])
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn):
        try:
            while conn.recv(65536):
                conn.sendall(f"pong {self.name}".encode())
        except OSError:
            pass

    def _serve_udp(self):
        while True:
            try:
                data, peer = self.sock.recvfrom(100)
                self.sock.sendto(f"pong {self.name}".encode(), peer)
            except OSError:
                return

    @property
    def port(self):
        return self.address[1]

    def close(self):
        self.sock.close()
        for c in self.connections:
            c.close()


@pytest.fixture
def echo():
    servers = []

    def make(name, **kw):
        servers.append(EchoServer(name, **kw))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def host_addresses():
    """Every IPv4 and IPv6 address of the host's interfaces."""
    out = json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout)
    return sorted({a["local"] for link in out for a in link.get("addr_info", [])})


def run_probe(worker, name, targets):
    return worker.client.run(name, {"targets": [list(t) for t in targets]})


def refused_at_once(attempt):
    """Refused or unreachable (never answered, never a timeout), within half a second."""
    return attempt["outcome"].split(":")[0] in ("ConnectionRefusedError", "OSError", "PermissionError") \
        and "timed out" not in attempt["outcome"] and attempt["ms"] < 500


@pytest.mark.parametrize("backend", ["sock", "gvisor", "gvisor-host"])
def test_a_sandbox_reaches_its_services_by_name_and_nothing_else(make_worker, echo, backend):
    """On the lean back-end the host's kernel routes the lambda's namespace; on gvisor, gVisor's
    own network stack runs over the same namespace, or (gvisor-host: `[gvisor] network =
    "host"`) the Sentry makes host sockets inside it; the same allow-list on the host."""
    allowed = echo("db")
    other = echo("other")  # listening on the host too, but not allowed
    udp = echo("dns", udp=True)
    host_stack = {"gvisor": {"network": "host"}} if backend == "gvisor-host" else {}
    w = make_worker(sandbox={"backend": backend.removesuffix("-host")}, **host_stack,
                    network={"allow": [{"name": "db", "address": f"127.0.0.1:{allowed.port}"},
                                       {"name": "dns", "address": f"127.0.0.1:{udp.port}", "protocol": "udp"}]})
    w.deploy_source("probe", PROBE)
    first = run_probe(w, "probe", [])
    db_address = first["services"]["db"]
    vip, _, _ = db_address.rpartition(":")
    gateway = vip.rsplit(".", 1)[0] + ".0"  # the block's first address
    assert first["env"] == {"SPROUT_SERVICE_DB": db_address, "SPROUT_SERVICE_DNS": first["services"]["dns"]}
    # Its own loopback and one link: nothing of the host's.
    links = sorted(line.split(":")[0].strip() for line in first["links"] if line.strip())
    assert links == ["eth0", "lo"]
    targets = [("db", allowed.port, "tcp"), (vip, allowed.port, "tcp"), ("dns", udp.port, "udp")]
    refused = [("127.0.0.1", allowed.port, "tcp"), ("127.0.0.1", w.port, "tcp"), (vip, other.port, "tcp"), (vip, w.port, "tcp"),
               (gateway, w.port, "tcp"), ("1.1.1.1", 443, "tcp"), ("db", other.port, "tcp"), (vip, 53, "udp")]
    refused += [(a, w.port, "tcp") for a in host_addresses()]
    refused += [(a, other.port, "tcp") for a in host_addresses()]
    out = run_probe(w, "probe", targets + refused)
    tries = out["tries"]
    for target, attempt in zip(targets, tries[:len(targets)]):
        assert attempt["outcome"] == f"ok pong {'dns' if target[2] == 'udp' else 'db'}", (target, attempt)
    for target, attempt in zip(refused, tries[len(targets):]):
        assert refused_at_once(attempt), (target, attempt)
    # A service on the host's loopback sees the sandbox as a local client, as it did when
    # sandboxes shared the host's network (its access rules for 127.0.0.1 still hold).
    assert allowed.peers and set(allowed.peers) == {"127.0.0.1"}, allowed.peers
    # The worker's API was never reached from the sandbox, over any address.
    assert w.client.status() == "ready\n"


@pytest.mark.parametrize("network", ["sandbox", "host"])
def test_a_gvisor_pod_restored_from_a_template_reaches_its_services(make_worker, echo, network):
    """A lambda's first pod restored from the template another lambda's made, in a container
    created ahead in a namespace of its own and lent the lambda's link, reaches its services
    and nothing else, through either network stack."""
    allowed, other = echo("db"), echo("other")
    w = make_worker(sandbox={"backend": "gvisor", "start_timeout_ms": 60000}, gvisor={"network": network},
                    network={"allow": [{"name": "db", "address": f"127.0.0.1:{allowed.port}"}]})
    w.deploy_source("maker", PROBE)
    run_probe(w, "maker", [])
    deadline = time.time() + 30
    while "gVisor template made" not in w.log() and time.time() < deadline:
        time.sleep(0.1)
    w.deploy_source("restored", PROBE)
    out = run_probe(w, "restored", [("db", allowed.port, "tcp"), ("db", other.port, "tcp")])
    assert w.log().count("restored from its package set's template") == 1, w.log()[-3000:]
    assert out["tries"][0]["outcome"] == "ok pong db", out["tries"]
    assert refused_at_once(out["tries"][1]), out["tries"]


def test_services_for_some_lambdas_only(make_worker, echo):
    shared, private = echo("shared"), echo("private")
    w = make_worker(network={"allow": [{"name": "shared", "address": f"127.0.0.1:{shared.port}"},
                                      {"name": "private", "address": f"127.0.0.1:{private.port}", "lambdas": ["chosen"]}]})
    w.deploy_source("chosen", PROBE)
    w.deploy_source("other", PROBE)
    chosen = run_probe(w, "chosen", [("private", private.port, "tcp"), ("shared", shared.port, "tcp")])
    assert [t["outcome"] for t in chosen["tries"]] == ["ok pong private", "ok pong shared"]
    vip = chosen["services"]["private"].rpartition(":")[0]
    other = run_probe(w, "other", [(vip, private.port, "tcp"), ("shared", shared.port, "tcp")])
    assert "private" not in other["services"]
    assert refused_at_once(other["tries"][0]), other["tries"][0]
    assert other["tries"][1]["outcome"] == "ok pong shared"
    # Each lambda has a namespace of its own, which all its sandboxes share.
    assert chosen["netns"] != other["netns"]
    assert run_probe(w, "chosen", [])["netns"] == chosen["netns"]


HOG = '''
import os, socket, time

def f(event):
    host, _, port = os.environ["SPROUT_SERVICE_DB"].rpartition(":")
    held, refused = [], 0
    for _ in range(event["connections"]):
        try:
            held.append(socket.create_connection((host, int(port)), timeout=3))
        except OSError:
            refused += 1
    sent, until = 0, time.monotonic() + event["flood_s"]
    if held:
        held[0].setblocking(False)
        chunk = b"x" * 65536
        while time.monotonic() < until:
            try:
                sent += held[0].send(chunk)
            except BlockingIOError:
                time.sleep(0)
    return {"connected": len(held), "refused": refused, "sent_mb": sent >> 20}
'''


def test_a_lambda_cannot_hold_more_connections_than_allowed_nor_starve_the_worker(make_worker, echo):
    db = echo("db")
    w = make_worker(network={"max_connections": 20, "allow": [{"name": "db", "address": f"127.0.0.1:{db.port}"}]},
                    limits={"cpus": 1.0, "timeout_ms": 20000})
    w.deploy_source("hog", HOG)
    result = {}
    worker_latency = []
    thread = threading.Thread(target=lambda: result.update(w.client.run("hog", {"connections": 60, "flood_s": 3})))
    thread.start()
    time.sleep(0.5)
    while thread.is_alive():
        began = time.perf_counter()
        assert w.client.status() == "ready\n"
        worker_latency.append(time.perf_counter() - began)
        time.sleep(0.05)
    thread.join()
    assert result["connected"] == 20 and result["refused"] == 40, result
    assert result["sent_mb"] > 0
    # The worker answered throughout (a generous bound: the machine is shared).
    assert worker_latency and max(worker_latency) < 1.0, worker_latency


@pytest.fixture
def remote_host():
    """A second host: a network namespace joined to this one by a veth pair, with a service
    listening on its own address."""
    name = f"sprout-remote-{int(time.time() * 1000) % 100000}"
    host_if, peer_if = f"rh{name[-5:]}", "eth0"
    host_ip, peer_ip = "192.168.213.1", "192.168.213.2"
    cmds = [["ip", "netns", "add", name],
            ["ip", "link", "add", host_if, "type", "veth", "peer", "name", peer_if, "netns", name],
            ["ip", "addr", "add", f"{host_ip}/30", "dev", host_if], ["ip", "link", "set", host_if, "up"],
            ["ip", "-n", name, "addr", "add", f"{peer_ip}/30", "dev", peer_if], ["ip", "-n", name, "link", "set", peer_if, "up"],
            ["ip", "-n", name, "link", "set", "lo", "up"]]
    for c in cmds:
        subprocess.run(c, check=True)
    server = subprocess.Popen(["ip", "netns", "exec", name, "python3", "-c",
                               "import socket\ns=socket.socket();s.bind(('0.0.0.0',7000));s.listen()\n"
                               "while True:\n c,_=s.accept();c.recv(100);c.sendall(b'pong remote');c.close()"])
    # Replies from the remote host arrive on host_if and are forwarded to the sandbox.
    forwarding = f"/proc/sys/net/ipv4/conf/{host_if}/forwarding"
    with open(forwarding, "w") as f:
        f.write("1")
    time.sleep(0.3)
    yield f"{peer_ip}:7000"
    server.kill()
    server.wait()
    subprocess.run(["ip", "netns", "del", name])


def test_a_service_on_another_host(make_worker, remote_host):
    w = make_worker(network={"allow": [{"name": "remote", "address": remote_host}]})
    w.deploy_source("probe", PROBE)
    out = run_probe(w, "probe", [("remote", 7000, "tcp"), (remote_host.split(":")[0], 7000, "tcp"), ("remote", 7001, "tcp")])
    assert out["tries"][0]["outcome"] == "ok pong remote", out["tries"]
    assert refused_at_once(out["tries"][1]) and refused_at_once(out["tries"][2]), out["tries"]


def test_a_deleted_lambda_gives_its_namespace_back(make_worker):
    w = make_worker(network={"pool": 2})
    w.deploy_source("probe", PROBE)
    run_probe(w, "probe", [])
    before = w.client.stats()["network"]
    assert before["isolated"] and before["lambdas_holding_namespaces"] == 1
    metrics = w.client.metrics()
    assert 'sprout_network_namespaces{state="in_use"}' in metrics and "sprout_network_namespaces_made_total" in metrics
    w.client.delete("probe")
    deadline = time.time() + 30
    while time.time() < deadline:
        # Its sandbox idles until reaped; the namespace goes with the last one.
        stats = w.client.stats()["network"]
        if stats["namespaces_destroyed"] >= 1:
            break
        time.sleep(0.2)
    assert stats["lambdas_holding_namespaces"] == 0


def test_past_the_limit_idle_lambdas_give_their_namespaces_back(make_worker):
    w = make_worker(network={"pool": 1, "max_namespaces": 4}, instances={"keep_warm": False})
    for i in range(6):
        w.deploy_source(f"p{i}", PROBE)
        run_probe(w, f"p{i}", [])
    stats = w.client.stats()["network"]
    assert stats["lambdas_holding_namespaces"] <= 3, stats
    assert stats["namespace_failures"] == 0


def test_sandboxes_can_share_the_host_network_when_asked(make_worker, echo):
    db = echo("db")
    w = make_worker(network={"isolate": False, "allow": [{"name": "db", "address": f"127.0.0.1:{db.port}"}]})
    w.deploy_source("probe", PROBE)
    out = run_probe(w, "probe", [("db", db.port, "tcp"), ("127.0.0.1", db.port, "tcp")])
    assert out["services"] == {"db": f"127.0.0.1:{db.port}"}
    assert [t["outcome"] for t in out["tries"]] == ["ok pong db", "ok pong db"]
    assert w.client.stats()["network"] == {"isolated": False}


def test_a_malformed_allowlist_is_refused_at_start_with_its_line(tmp_path):
    w = Worker(tmp_path / "w", {"network": {"allow": [{"name": "db", "address": "localhost:5432"}]}})
    w.sprout("worker", "init", w.dir, check=False)
    up = w.sprout("worker", "up", w.dir, check=False, timeout=60)
    assert up.returncode != 0
    line = next(i for i, text in enumerate((w.dir / "config.toml").read_text().splitlines(), 1) if "localhost:5432" in text)
    assert f"line {line}: network.allow[0].address" in up.stderr and "IPv4 address and port" in up.stderr, up.stderr


def test_nothing_is_left_after_a_kill_9(make_worker, echo):
    db = echo("db")
    w = make_worker(network={"allow": [{"name": "db", "address": f"127.0.0.1:{db.port}"}]},
                    handler_cache={"pause_after_ms": 1})
    for name in ("a", "b", "c"):
        w.deploy_source(name, PROBE)
        run_probe(w, name, [("db", db.port, "tcp")])
    time.sleep(0.3)  # some are paused now: frozen processes keep their namespaces alive
    assert network_leftovers(w.network_tag, w.dir)
    w.process.kill()
    w.process.wait()
    w.process = None
    report = json.loads(subprocess.run([str(SPROUT), "worker", "cleanup", str(w.dir)], capture_output=True, text=True,
                                       check=True).stdout)
    assert any(r.startswith("nftables table") for r in report["network_removed"]), report
    assert w.network_leftovers() == []
    # Starting again after a crash needs no cleanup first: the worker does it.
    w.start()
    w.deploy_source("a", PROBE)
    assert run_probe(w, "a", [("db", db.port, "tcp")])["tries"][0]["outcome"] == "ok pong db"
    w.process.kill()
    w.process.wait()
    w.process = None
    w.start()
    assert w.client.status() == "ready\n"
