"""Hostile lambdas: each tries, as a tenant bent on harm would, to reach what is not its own —
the worker's API, the host's processes, files, devices and kernel interfaces, other sandboxes'
scratch, its own code and base — and each attempt must fail. The closing note of issue 16 lists
these probes and what they got; `sprout.invoke`'s channel is probed in test_invoke.py and the
network in test_network.py."""

import json
import os
import socket
import subprocess
import time

import pytest

from conftest import Worker, offline, targz, zygote_nodes

# Runs every probe and reports what each got: "denied: <why>" or "ALLOWED: <what>".
HOSTILE = r'''
import ctypes, errno, json, os, signal, socket, stat, struct

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

NR = {"ptrace": 101, "perf_event_open": 298, "bpf": 321, "userfaultfd": 323, "keyctl": 250, "add_key": 248,
      "io_uring_setup": 425, "unshare": 272, "setns": 308, "mount": 165, "chroot": 161, "clone": 56,
      "process_vm_readv": 310, "init_module": 175, "open_tree": 428, "fsopen": 430, "kexec_load": 246,
      "syslog": 103, "pivot_root": 155, "mknod": 133, "setuid": 105, "pidfd_getfd": 438}

def sys_call(name, *args):
    args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    rc = libc.syscall(ctypes.c_long(NR[name]), *args)
    if rc == -1:
        e = ctypes.get_errno()
        return "denied: " + errno.errorcode.get(e, str(e))
    return f"ALLOWED: returned {rc}"

def attempt(fn):
    try:
        out = fn()
        return "ALLOWED: " + repr(out)[:200]
    except OSError as e:
        return "denied: " + (errno.errorcode.get(e.errno, str(e.errno)) if e.errno else str(e))
    except Exception as e:
        return "denied: " + type(e).__name__ + ": " + str(e)[:100]

def write(path, data=b"x"):
    with open(path, "wb") as f:
        f.write(data)

def connect(host, port, family=socket.AF_INET):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect((host, port))
        s.sendall(b"GET /registry HTTP/1.0\r\n\r\n")
        return s.recv(200)

def abstract(name):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect("\0" + name)
        return "connected"

def find_scratch_secret(secret):
    # Another sandbox's /tmp is a tmpfs of its own; look everywhere this one can see.
    for top in ("/host", "/tmp", "/proc"):
        for root, dirs, files in os.walk(top):
            if root.startswith("/proc") and root.count("/") > 3:
                dirs[:] = []
            for name in files:
                try:
                    if not stat.S_ISREG(os.stat(os.path.join(root, name)).st_mode):
                        continue  # a FIFO or a socket (a pod's) holds no file; reading one waits
                    with open(os.path.join(root, name), "rb") as f:
                        if secret.encode() in f.read(1 << 16):
                            return os.path.join(root, name)
                except OSError:
                    pass
    raise FileNotFoundError("no file holds the other sandbox's secret")

def chroot_escape():
    os.makedirs("/tmp/jail", exist_ok=True)
    os.chroot("/tmp/jail")
    for _ in range(64):
        os.chdir("..")
    os.chroot(".")
    return os.listdir("/")

def f(event):
    out = {}
    api_port = event["api_port"]
    for addr in event["host_addresses"]:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        out[f"worker API at {addr}"] = attempt(lambda: connect(addr, api_port, family))
    out["host port not allowed"] = attempt(lambda: connect("127.0.0.1", event["host_port"]))
    out["host's abstract Unix socket"] = attempt(lambda: abstract(event["abstract"]))
    out["another sandbox's scratch"] = attempt(lambda: find_scratch_secret(event["secret"]))
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit()) if os.path.isdir("/proc/self") else []
    out["host processes in /proc"] = f"ALLOWED: {pids}" if [p for p in pids if p > 100] else f"denied: only {pids}"
    out["signal the worker"] = attempt(lambda: os.kill(event["worker_pid"], signal.SIGTERM))
    out["host file by absolute path"] = attempt(lambda: open(event["host_file"]).read())
    out["/etc/shadow of the base"] = attempt(lambda: open("/etc/shadow").read())
    out["escape the chroot"] = attempt(chroot_escape)
    out["write its code"] = attempt(lambda: write("/handler/f.py"))
    out["write the base"] = attempt(lambda: write("/usr/bin/python3"))
    out["write the runtime"] = attempt(lambda: write("/opt/sprout/helper.py"))
    out["write the packages"] = attempt(lambda: write("/packages/x"))
    out["mount"] = sys_call("mount", b"none", b"/tmp", b"tmpfs", 0, None)
    out["new user namespace"] = sys_call("unshare", 0x10000000)
    out["new network namespace"] = sys_call("unshare", 0x40000000)
    out["clone into a new user namespace"] = sys_call("clone", 0x10000000 | 17, 0, 0, 0, 0)
    own = os.open("/proc/self/ns/net", os.O_RDONLY) if os.path.exists("/proc/self/ns/net") else 0
    out["join a namespace"] = sys_call("setns", own, 0)
    out["open_tree"] = sys_call("open_tree", -100, b"/", 1)
    out["fsopen"] = sys_call("fsopen", b"tmpfs", 0)
    out["pivot_root"] = sys_call("pivot_root", b"/tmp", b"/tmp")
    out["load BPF"] = sys_call("bpf", 5, 0, 0)
    out["ptrace the helper"] = sys_call("ptrace", 16, 1, 0, 0)
    out["read another process's memory"] = sys_call("process_vm_readv", 1, 0, 0, 0, 0, 0)
    out["take another process's descriptor"] = sys_call("pidfd_getfd", 0, 0, 0)
    out["perf_event_open"] = sys_call("perf_event_open", 0, 0, -1, -1, 0)
    out["userfaultfd"] = sys_call("userfaultfd", 0)
    out["kernel keyring"] = sys_call("add_key", b"user", b"k", b"v", 1, -4)
    out["keyctl"] = sys_call("keyctl", 0, -4, 0, 0, 0)
    out["io_uring"] = sys_call("io_uring_setup", 1, 0)
    out["load a kernel module"] = sys_call("init_module", 0, 0, b"")
    out["load a kernel"] = sys_call("kexec_load", 0, 0, 0, 0)
    out["read the kernel log"] = sys_call("syslog", 3, 0, 0)
    out["make a device node"] = sys_call("mknod", b"/tmp/null", 0o20666, (1 << 8) | 3)
    out["become root"] = sys_call("setuid", 0)
    out["raw socket"] = attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
    out["packet socket"] = attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0))
    out["write a kernel setting"] = attempt(lambda: write("/proc/sys/kernel/hostname", b"pwned"))
    out["sysrq"] = attempt(lambda: write("/proc/sysrq-trigger", b"h"))
    out["/sys"] = attempt(lambda: os.listdir("/sys/class/net"))
    out["kernel memory"] = attempt(lambda: open("/proc/kcore", "rb").read(1))
    return out
'''

# Leaves a secret in its scratch and stays alive (paused) with it.
KEEPER = '''
def f(event):
    with open("/tmp/secret", "w") as f:
        f.write(event["secret"])
    return "kept"
'''


def host_addresses():
    out = json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout)
    return sorted({a["local"] for link in out for a in link.get("addr_info", []) if not a["local"].startswith("fe80")})


@pytest.mark.parametrize("backend", ["sock", "sock-nozygote", "package Zygote", "gvisor", "gvisor-host", "gvisor-parked"])
def test_every_attempt_to_reach_beyond_the_sandbox_fails(tmp_path, sprout_bin, wheel_dir, backend):
    """With each way a handler comes to be: forked from the root Zygote, started afresh,
    forked from a Zygote that imported a package (in the package Zygotes' user namespace), in
    a gVisor pod (either network stack), and in a gVisor pod parked to disk and restored."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0sprout-hostile-test-{os.getpid()}")
    abstract.listen()
    kind = backend.removesuffix("-host").removesuffix("-parked")
    settings = offline(wheel_dir) if backend == "package Zygote" else {"sandbox": {"backend": kind}}
    if backend == "gvisor-host":  # the Sentry's sockets the host's, inside the lambda's namespace
        settings["gvisor"] = {"network": "host"}
    if backend == "gvisor-parked":  # every pod parked soon after its request
        settings.update(gvisor={"park_after_ms": 300}, handler_cache={"pause_after_ms": 50})
    w = Worker(tmp_path / "w", settings)
    w.start()
    try:
        w.deploy_source("keeper", KEEPER)
        secret = f"the-secret-{os.getpid()}"
        assert w.client.run("keeper", {"secret": secret}) == "kept"
        if backend == "package Zygote":
            w.client.upload("hostile", targz({"f.py": "import gamma\n" + HOSTILE, "requirements.txt": "gamma==1.0\n"}))
        else:
            w.deploy_source("hostile", HOSTILE)
        event = {
            "api_port": w.port, "host_addresses": host_addresses(), "host_port": listener.getsockname()[1],
            "abstract": f"sprout-hostile-test-{os.getpid()}", "secret": secret, "worker_pid": w.process.pid,
            "host_file": str(w.dir / "config.toml"),
        }
        if backend == "gvisor-parked":
            w.client.run("hostile", event)  # its pod made; then both pods are parked
            parking = lambda: w.client.stats()["backends"]["gvisor"]["counters"]["parking"]  # noqa: E731
            deadline = time.time() + 30
            while parking()["parked"] < 2 and time.time() < deadline:
                time.sleep(0.1)
            assert parking()["parked"] == 2, parking()
        report = w.client.run("hostile", event)
        if backend == "gvisor-parked":
            assert parking()["restores"] >= 1, parking()
        if backend == "package Zygote":
            assert any("gamma==1.0" in node["adds"] for node in zygote_nodes(w.client.stats()))
        allowed = {probe: got for probe, got in report.items() if not got.startswith("denied")}
        assert allowed == {}, json.dumps(report, indent=1)
        # What it was refused with is the kernel's answer, not a crash of the probe.
        assert report["load BPF"] == "denied: EPERM" and report["new user namespace"] == "denied: EPERM"
        if backend != "package Zygote":  # (no /proc there: nothing to join)
            assert report["join a namespace"] == "denied: EPERM"
        assert report["escape the chroot"].startswith("denied: EPERM")
        # (gVisor's kernel checks the file's owner before the mount's read-only flag.)
        assert report["write its code"] == ("denied: EACCES" if backend.startswith("gvisor") else "denied: EROFS")
        (tmp_path / f"report-{backend.replace(' ', '-')}.json").write_text(json.dumps(report, indent=1))
        # The worker and the other lambda are unharmed.
        assert w.client.status() == "ready\n" and w.client.run("keeper", {"secret": "again"}) == "kept"
    finally:
        w.stop()
        listener.close()
        abstract.close()
    assert w.leftovers() == []
