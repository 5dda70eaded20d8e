"""Who is logged in: password hashes, login checks, and the `login_required` decorator.

Passwords are stored as ``salt$hex`` with hex = SHA-256(salt + password). That is a fast
hash on purpose: Olio itself stored plain passwords, and the loader must create 100,000
users (Cloudstone's scale) in minutes, which a slow KDF (bcrypt, scrypt: ~50-250 ms each)
would turn into hours. It is salted, so equal passwords get different hashes, and compared
in constant time. A real site would use a slow KDF (hashlib.scrypt) instead.

The session (Flask's signed cookie) holds the user's id and name, so pages know who is
logged in without a query.
"""

import functools
import hashlib
import hmac
import secrets

from flask import jsonify, redirect, request, session, url_for

SALT_BYTES = 8


def hash_password(plain, salt=None):
    """``salt$sha256hex`` of ``plain``; a random salt unless one is given (the loader passes
    a deterministic one)."""
    if salt is None:
        salt = secrets.token_hex(SALT_BYTES)
    if "$" in salt:
        raise ValueError("a salt cannot contain '$'")
    return f"{salt}${hashlib.sha256((salt + plain).encode()).hexdigest()}"


def check_password(plain, stored):
    """Whether ``plain`` is the password ``stored`` (a hash_password result) was made from."""
    salt, sep, _ = stored.partition("$")
    if not sep:
        return False
    return hmac.compare_digest(hash_password(plain, salt), stored)


def log_in(user_id, username):
    session.clear()
    session["uid"] = user_id
    session["name"] = username


def log_out():
    session.clear()


def current_user():
    """(id, username) of the logged-in user, or None."""
    uid = session.get("uid")
    if type(uid) is not int:
        return None
    return uid, session.get("name", "")


def wants_json():
    """Whether the request came from the pages' JavaScript (jQuery-style marker header)."""
    return request.headers.get("X-Requested-With", "").lower() == "xmlhttprequest"


def login_required(view):
    """Run `view` for a logged-in user; otherwise redirect to the login page (and back
    afterwards, for GETs), or answer 401 JSON to AJAX requests."""

    @functools.wraps(view)
    def wrapped(*args, **kwargs):
        if current_user() is None:
            if wants_json():
                return jsonify(error="log in first", login=url_for("users.login")), 401
            back = request.full_path.rstrip("?") if request.method == "GET" else request.referrer
            return redirect(url_for("users.login", next=safe_next(back)), code=303)
        return view(*args, **kwargs)

    return wrapped


def safe_next(target):
    """`target` if it is a path on this site (no scheme, no host), else None: the login
    page never redirects elsewhere."""
    if not target:
        return None
    if target.startswith(request.host_url):
        target = "/" + target[len(request.host_url):]
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return None
    return target
