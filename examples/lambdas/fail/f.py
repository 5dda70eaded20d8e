"""A lambda that fails: the worker answers 500 with the traceback."""


def f(event):
    raise RuntimeError(f"this lambda always fails (event was {event!r})")
