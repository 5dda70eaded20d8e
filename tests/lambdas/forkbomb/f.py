"""Forks until the pids limit stops it; the children sleep. Reports how far it got."""
import os
import time


def f(event):
    children = 0
    error = None
    while children < 10_000:
        try:
            pid = os.fork()
        except OSError as e:
            error = str(e)
            break
        if pid == 0:
            time.sleep(3600)
            os._exit(0)
        children += 1
    return {"children": children, "error": error}
