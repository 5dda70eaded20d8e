"""Leaves a background process behind after answering."""
import subprocess


def f(event):
    child = subprocess.Popen(["sleep", "3600"], start_new_session=True)
    return {"child_pid_in_sandbox": child.pid, "marker": "sleep 3600"}
