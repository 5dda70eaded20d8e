"""Leaves a thread of its own running after answering, and counts the requests its
sandbox has served."""
import threading
import time

calls = 0


def f(event):
    global calls
    calls += 1
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
    return {"calls": calls, "threads": threading.active_count()}
