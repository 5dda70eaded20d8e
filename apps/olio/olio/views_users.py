"""The people pages: registration, name check, login and logout, person detail, friends."""

from flask import Blueprint, abort, g, jsonify, redirect, render_template, request, url_for

from . import auth, data, forms, writes
from . import cache as caching
from .auth import login_required, wants_json
from .current import olio

users = Blueprint("users", __name__)


@users.get("/users/new")
def new_user():
    return render_template("user_form.html", form=forms.Form({}))


@users.post("/users")
def create_user():
    form = forms.registration(request.form, request.files)
    if not form.ok:
        return render_template("user_form.html", form=form), 422
    user, store = form.clean["user"], olio("files")
    user.password = auth.hash_password(user.password)
    saved = []
    try:
        if form.clean["image"]:
            user.image = store.save_image(form.clean["image"])
            saved += [user.image.filename, user.image.thumbnail]
        user_id = writes.create_user(user)
    except writes.UsernameTaken as e:
        store.delete(*saved)
        form.fail("username", str(e).capitalize())
        return render_template("user_form.html", form=form), 422
    except BaseException:
        store.delete(*saved)
        raise
    auth.log_in(user_id, user.username)
    return redirect(url_for("users.person", user_id=user_id), code=303)


@users.post("/users/check_name")
def check_name():
    """AJAX: whether a user name may be registered, and if not, why."""
    name = request.form.get("username", "").strip()
    if not forms.USERNAME.fullmatch(name):
        return jsonify(available=False, message="a user name is 3-25 letters, digits, '.', '_' or '-'")
    if data.username_taken(name):
        return jsonify(available=False, message=f"{name} is taken")
    return jsonify(available=True, message=f"{name} is free")


@users.route("/users/login", methods=["GET", "POST"])
def login():
    next_page = auth.safe_next(request.values.get("next"))
    if request.method == "GET":
        return render_template("login.html", form=forms.Form({}), next=next_page)
    form = forms.login(request.form)
    if form.ok:
        record = data.login_record(form.clean["username"])
        if record is not None and auth.check_password(form.clean["password"], record[1]):
            auth.log_in(record[0], form.clean["username"])
            return redirect(next_page or url_for("events.home"), code=303)
        form.fail("password", "Wrong user name or password")
    return render_template("login.html", form=form, next=next_page), 422


@users.get("/users/logout")
def logout():
    auth.log_out()
    return redirect(url_for("events.home"), code=303)


@users.get("/users/<int:user_id>")
def person(user_id):
    shown = olio("cache").fetch(f"user:{user_id}", caching.TTL_PAGES, lambda: data.person(user_id),
                                depends=[caching.person_counter(user_id)])
    viewer = g.user[0] if g.user else None
    incoming = outgoing = None
    if viewer == user_id:
        incoming, outgoing = data.friend_requests(user_id)
    relationship = data.relationship(viewer, user_id) if viewer is not None else None
    return render_template("person.html", **shown, incoming=incoming, outgoing=outgoing, relationship=relationship)


def _friend_action(user_id, change, done):
    if not data.user_exists(user_id):
        abort(404)
    change(g.user[0], user_id)
    olio("cache").bump(caching.person_counter(g.user[0]), caching.person_counter(user_id))
    if wants_json():
        return jsonify(ok=True, message=done, relationship=data.relationship(g.user[0], user_id))
    back = auth.safe_next(request.form.get("next")) or url_for("users.person", user_id=user_id)
    return redirect(back, code=303)


@users.post("/users/<int:user_id>/invite")
@login_required
def invite(user_id):
    return _friend_action(user_id, writes.invite, "friend request sent")


@users.post("/users/<int:user_id>/approve")
@login_required
def approve(user_id):
    return _friend_action(user_id, writes.approve, "friend request approved")


@users.post("/users/<int:user_id>/reject")
@login_required
def reject(user_id):
    return _friend_action(user_id, writes.reject, "friend request rejected")


@users.post("/users/<int:user_id>/revoke")
@login_required
def revoke(user_id):
    return _friend_action(user_id, writes.revoke, "friend request withdrawn")
