"""The running site's settings, as `web.configure` gave them to the application.

`olio(key)` for the pages, and `file_url` for their templates."""

from flask import current_app


def olio(key):
    """The running app's `config`, `cache` or `files` (the FileStore)."""
    return current_app.extensions["olio"][key]


def file_url(name):
    """The URL of file-store file `name` (None stays None)."""
    return None if not name else f"{olio('config').files_url}/{name}"
