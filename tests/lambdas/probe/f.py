"""Reports what a handler can and cannot do inside its sandbox."""
import os
import socket


def attempt(action):
    try:
        result = action()
        return {"ok": True, "result": result}
    except Exception as e:  # report the failure kind, e.g. OSError [Errno 30]
        return {"ok": False, "error": f"{type(e).__name__}: {e}", "errno": getattr(e, "errno", None)}


def write(path):
    with open(path, "w") as f:
        f.write("tampered")
    return path


def read(path):
    with open(path) as f:
        return f.read(200)


def escape_chroot():
    # The classic escape needs CAP_SYS_CHROOT, which the sandbox user does not have.
    os.makedirs("/tmp/esc", exist_ok=True)
    os.chroot("/tmp/esc")
    for _ in range(64):
        os.chdir("..")
    os.chroot(".")
    return os.listdir("/")


def visible_pids():
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())


def signal_pid(pid):
    os.kill(pid, 0)
    return pid


def f(event):
    event = event or {}
    out = {
        "pid": os.getpid(),
        "uid": os.getuid(),
        "gid": os.getgid(),
        "hostname": socket.gethostname(),
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "write_code": attempt(lambda: write("/handler/f.py")),
        "write_new_code": attempt(lambda: write("/handler/new.py")),
        "write_base": attempt(lambda: write("/usr/bin/python3")),
        "write_etc": attempt(lambda: write("/etc/passwd")),
        "write_runtime": attempt(lambda: write("/opt/sprout/helper.py")),
        "write_tmp": attempt(lambda: write("/tmp/scratch-file")),
        "escape_chroot": attempt(escape_chroot),
        "proc_pids": attempt(visible_pids),
    }
    for path in event.get("read", []):
        out.setdefault("reads", {})[path] = attempt(lambda p=path: read(p))
    for pid in event.get("signal", []):
        out.setdefault("signals", {})[str(pid)] = attempt(lambda p=pid: signal_pid(p))
    return out
