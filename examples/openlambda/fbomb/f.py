"""Forks `times` children that each sleep; returns how many forks succeeded before the
sandbox's process limit stopped them."""
import os
import time


def f(event):
    made = 0
    for _ in range(event["times"]):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        made += 1
    return made
