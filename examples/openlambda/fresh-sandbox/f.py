"""Counts its calls in a module global: with reuse-sandbox false every call is the first."""
calls = 0


def f(event):
    global calls
    calls += 1
    return {"calls": calls}
