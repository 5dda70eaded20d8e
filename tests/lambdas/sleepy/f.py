import os
import time


def f(event):
    time.sleep((event or {}).get("seconds", 0))
    return {"pid": os.getpid(), "slept": (event or {}).get("seconds", 0)}
