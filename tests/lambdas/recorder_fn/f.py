"""f(event) that appends the event's tag to a journal on a writable volume (so a test can see
whether an invocation ran, and how often), then sleeps `nap` seconds if asked."""

import time

JOURNAL = "/srv/sprout-test-rw/journal.log"


def f(event):
    with open(JOURNAL, "a") as journal:
        journal.write(f"POST /f tag={event['tag']} -\n")  # the recorder app's line format
    time.sleep(event.get("nap", 0))
    return {"tag": event["tag"]}
