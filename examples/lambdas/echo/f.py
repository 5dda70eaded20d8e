"""Echo: returns the event it was given."""


def f(event):
    return event
