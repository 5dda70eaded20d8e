"""The Olio WSGI application: `create_app()` wires configuration, data, cache, file store,
the page modules (`olio.views_events`, `olio.views_users`), error pages and the static and
file-store routes together.

It does so in two steps, so that many sites can share one loaded application: `build_app`
makes the application without any site's settings (routes, pages, error handlers, every
template loaded), `configure` gives it one site's. `prepare()` builds one ahead, in the
process that will fork the sites' processes (a Sprout code Zygote, by the lambda's ol.yaml
`preload`); the first `create_app` in each forked process then only configures it.
"""

import logging
import os
import secrets
import tempfile
from pathlib import Path

import jinja2
from flask import Flask, abort, g, jsonify, render_template, send_from_directory
from werkzeug.exceptions import HTTPException

from . import auth, data
from . import cache as caching
from . import config as olio_config
from .current import file_url, olio
from .files import FileStore
from .writes import Refused

log = logging.getLogger("olio")

MAX_REQUEST_BYTES = 16 << 20  # a whole form: an image, a document and the text fields
STATIC_MAX_AGE = 3600  # seconds browsers may keep static files and uploads before asking again
# The templates compiled to Python ahead of time (`compile_templates`), when a deployment did.
COMPILED_TEMPLATES = Path(__file__).resolve().parent / "compiled_templates"


_prepared = None  # (the URLs it was built with, an application built ahead by prepare())


def create_app(config=None):
    """The Flask application serving Olio with `config` (default: `olio.config.load()`): the
    one `prepare()` built, if it was built for the same URLs and not yet given out, else a
    new one."""
    global _prepared
    config = config or olio_config.load()
    for key in ("static_url", "files_url"):
        value = getattr(config, key)
        if not value.startswith("/") or value.endswith("/") or len(value) < 2:
            raise olio_config.ConfigError(f"{key} must be a path like /static (not {value!r})")
    urls = (config.static_url, config.files_url)
    if _prepared is not None and _prepared[0] == urls:
        app, _prepared = _prepared[1], None
    else:
        app = build_app(*urls)
    return configure(app, config)


def build_app(static_url="/static", files_url="/files"):
    """The application without a site's settings: its routes, pages, error handlers and
    templates. `configure` must be called before it serves."""
    from .views_events import events
    from .views_users import users

    app = Flask("olio", static_url_path=static_url)
    app.config.update(
        MAX_CONTENT_LENGTH=MAX_REQUEST_BYTES,
        SESSION_COOKIE_SAMESITE="Lax",  # a cross-site POST carries no session (no CSRF)
        SESSION_COOKIE_HTTPONLY=True,
        SEND_FILE_MAX_AGE_DEFAULT=STATIC_MAX_AGE,
    )
    app.register_blueprint(events)
    app.register_blueprint(users)
    app.add_url_rule(f"{files_url}/<path:name>", "stored_file", stored_file)
    app.before_request(_who_is_there)
    app.after_request(_headers)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(data.NotFound, lambda e: _error_page(404, "There is no such page."))
    app.register_error_handler(Refused, lambda e: _error_page(e.status, str(e)))
    app.register_error_handler(data.StoreError, _store_error)
    for lost in _lost_connection_errors():
        app.register_error_handler(lost, _store_error)
    _setup_jinja(app, COMPILED_TEMPLATES)
    return app


def configure(app, config):
    """Give `app` (from `build_app`) one site's settings: its database, cache, file store and
    cookie key."""
    store = FileStore(config.files)
    store.ensure()
    app.config["SECRET_KEY"] = config.secret or _kept_secret(store.root)
    app.extensions["olio"] = {"config": config, "cache": caching.make(config), "files": store}
    data.configure(config.db)
    return app


WARM_PAGES = ("/", "/events/1", "/events/tag_search?tag=x", "/users/1", "/users/login", "/no-such-page")


def prepare():
    """Build the application ahead for the processes forked from this one (ol.yaml's
    `preload` call): every page's template loaded, and a few pages served once against an
    empty in-memory database with a throwaway key and file store, so that what Flask, Jinja
    and the store build on first use is built here, shared by the forks. Reads no site's
    settings and opens no connection; the warm-up's configuration is taken off again."""
    global _prepared
    app = build_app()
    templates = Path(__file__).resolve().parent / "templates"
    for path in sorted(templates.rglob("*.html")):
        app.jinja_env.get_template(path.relative_to(templates).as_posix())
    with tempfile.TemporaryDirectory(prefix="olio-warm-") as files:
        configure(app, olio_config.Config(db="sqlite::memory:", files=files, secret=secrets.token_hex(32)))
        try:
            client = app.test_client()
            for page in WARM_PAGES:
                client.get(page)
        finally:
            data.forget_connection()
            data.configure(None)
            del app.extensions["olio"]
            app.config["SECRET_KEY"] = None
    _prepared = (("/static", "/files"), app)


def _setup_jinja(app, compiled):
    app.jinja_env.filters.update(when=_when, day=_day)
    app.jinja_env.globals.update(file_url=file_url)
    stamp = compiled / "jinja2.version"
    if stamp.is_file() and stamp.read_text().strip() == jinja2.__version__:
        # A new process (a Sprout sandbox) imports each page's template instead of compiling it.
        app.jinja_env.loader = jinja2.ChoiceLoader([jinja2.ModuleLoader(str(compiled)), app.jinja_env.loader])


def compile_templates(target):
    """Compile every template to a Python module in `target`, with the Jinja2 version that
    did (used only by the same version). The Sprout deployments do, into the lambda's code,
    which the worker compiles to bytecode at upload; a template missing there is compiled
    from its source as before."""
    app = Flask("olio")
    _setup_jinja(app, Path(target))
    Path(target).mkdir(parents=True, exist_ok=True)
    app.jinja_env.compile_templates(str(target), zip=None, ignore_errors=False)
    (Path(target) / "jinja2.version").write_text(jinja2.__version__ + "\n")


def stored_file(name):
    """A file of the file store, with Last-Modified and 304 answers to If-Modified-Since.
    Hidden files (the kept secret, files being written) are never served."""
    if any(part.startswith(".") for part in name.split("/")):
        abort(404)
    return send_from_directory(olio("files").root, name, conditional=True, max_age=STATIC_MAX_AGE)


def _kept_secret(root):
    """The cookie-signing key kept in `<files>/.secret`, made by the first process to need
    it: written to a temporary file, then linked to its name, which fails if another
    process linked first (its key then wins), so every process ends with the same key."""
    path = Path(root) / ".secret"
    if not path.exists():
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".secret-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    key = path.read_text().strip()
    if len(key) < 32:
        raise olio_config.ConfigError(f"{path} holds no usable key: delete it (sessions will end) or set secret")
    return key


def _who_is_there():
    g.user = auth.current_user()


def _headers(response):
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("X-Frame-Options", "DENY")
    return response


def _error_page(status, message):
    if auth.wants_json():
        return jsonify(error=message), status
    return render_template("error.html", status=status, message=message), status


def _http_error(e):
    if e.code is None or e.code < 400:
        return e
    messages = {
        404: "There is no such page.",
        405: "This page does not accept that method.",
        413: f"The request is too large: a form may carry at most {MAX_REQUEST_BYTES >> 20} MiB in all.",
    }
    response = _error_page(e.code, messages.get(e.code, e.description))
    return response


def _lost_connection_errors():
    """The database driver's errors that mean a broken connection (beyond those sprout.store
    turns into StoreError)."""
    try:
        import psycopg
    except ImportError:
        return []
    return [psycopg.OperationalError]


def _store_error(e):
    data.forget_connection()  # the next request opens a new connection
    log.exception("database error")
    return _error_page(503, "The database is unavailable; please try again.")


def _when(moment):
    """A date and time for people: "Tue 5 May 2026, 14:30"."""
    return "" if moment is None else f"{moment:%a} {moment.day} {moment:%b %Y, %H:%M}"


def _day(moment):
    return "" if moment is None else f"{moment.day} {moment:%b %Y}"
