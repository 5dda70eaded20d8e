"""The event pages: home page, tag search, event detail, adding events, attendance, comments."""

from datetime import date

from flask import Blueprint, abort, g, jsonify, redirect, render_template, request, url_for
from markupsafe import Markup

from . import cache as caching
from . import data, forms, writes
from .auth import login_required, wants_json
from .current import olio

events = Blueprint("events", __name__)

MAX_PAGE = 100_000


def _page():
    text = request.args.get("page", "1")
    if not text.isdigit() or not 1 <= int(text) <= MAX_PAGE:
        abort(400, f"page must be a whole number from 1 to {MAX_PAGE}")
    return int(text)


def _day_filter():
    """The date filter: ?date=YYYY-MM-DD, or ?year=&month=&day= (all three), or None."""
    args = request.args
    if args.get("date"):
        try:
            return date.fromisoformat(args["date"])
        except ValueError:
            abort(400, "date must be a day written YYYY-MM-DD")
    parts = [args.get(k, "") for k in ("year", "month", "day")]
    if not any(parts):
        return None
    if not all(p.isdigit() for p in parts):
        abort(400, "to filter by date, give year, month and day as numbers")
    try:
        return date(*map(int, parts))
    except ValueError:
        abort(400, "year, month and day do not make a date")


def _fragment(key, ttl, render):
    """Rendered HTML from the cache (or rendered now); the same markup either way."""
    html = olio("cache").fetch(key, ttl, lambda: str(render()), depends=[caching.events_counter()])
    return Markup(html)


def _tag_cloud():
    def render():
        cloud = data.tag_cloud()
        top = max((n for _, n in cloud), default=1)
        sized = [(name, n, 1 + (4 * n) // top if top else 1) for name, n in cloud]  # classes 1-5
        return render_template("_tag_cloud.html", tags=sized)

    return _fragment("tagcloud", caching.TTL_CLOUD, render)


@events.get("/")
def home():
    page, day = _page(), _day_filter()
    zip_code = request.args.get("zip", "").strip()
    if zip_code and not forms.ZIP.fullmatch(zip_code):
        abort(400, "zip must be a zip code (letters, digits, spaces or dashes)")
    order = request.args.get("order", "event_date")
    if order not in data.ORDERS:
        abort(400, f"order must be one of {', '.join(data.ORDERS)}")
    filters = {"zip": zip_code, "date": day and day.isoformat(), "order": order if order != "event_date" else None}
    filters = {k: v for k, v in filters.items() if v}  # the links of other pages keep them

    def render():
        found, total = data.upcoming_events(zip_code or None, day, order, page)
        return render_template("_event_list.html", events=found, total=total, page=page,
                               pages=-(-total // data.PER_PAGE), link=lambda n: url_for("events.home", page=n, **filters))

    key = "home:" + caching.hashed(sorted(filters.items())) + f":{page}"
    listing = _fragment(key, caching.TTL_LISTS, render)
    return render_template("home.html", listing=listing, cloud=_tag_cloud(), zip=zip_code, day=day, order=order)


@events.get("/events/tag_search")
def tag_search():
    tag = request.args.get("tag", "").strip().lower()
    page = _page()
    if len(tag) > 100:
        abort(400, "tag is longer than 100 characters")

    def render():
        found, total = data.events_tagged(tag, page) if tag else ([], 0)
        return render_template("_event_list.html", events=found, total=total, page=page,
                               pages=-(-total // data.PER_PAGE), link=lambda n: url_for("events.tag_search", tag=tag, page=n))

    listing = _fragment(f"tags:{caching.hashed(tag)}:{page}", caching.TTL_LISTS, render)
    return render_template("tag_search.html", tag=tag, listing=listing, cloud=_tag_cloud())


def _detail(event_id):
    return olio("cache").fetch(f"event:{event_id}", caching.TTL_PAGES, lambda: data.event_detail(event_id),
                               depends=[caching.event_counter(event_id)])


def _event_page(event_id, status=200, comment_form=None):
    detail = _detail(event_id)
    attending = g.user is not None and data.is_attending(event_id, g.user[0])
    return render_template("event.html", **detail, attending=attending,
                           comment_form=comment_form or forms.Form({})), status


@events.get("/events/<int:event_id>")
def event(event_id):
    return _event_page(event_id)


@events.get("/events/new")
@login_required
def new_event():
    return render_template("event_form.html", form=forms.Form({}))


@events.post("/events")
@login_required
def create_event():
    form = forms.event(request.form, request.files)
    if not form.ok:
        return render_template("event_form.html", form=form), 422
    store, event = olio("files"), form.clean["event"]
    event.user_id = g.user[0]
    saved = []
    try:
        if form.clean["image"]:
            event.image = store.save_image(form.clean["image"])
            saved += [event.image.filename, event.image.thumbnail]
        if form.clean["document"]:
            event.document = store.save_document(form.clean["document"])
            saved.append(event.document.filename)
        event_id = writes.create_event(event, form.clean["tags"])
    except BaseException:
        store.delete(*saved)
        raise
    olio("cache").bump(caching.events_counter(), caching.person_counter(g.user[0]))
    return redirect(url_for("events.event", event_id=event_id), code=303)


def _attendance(event_id, change):
    changed = change(event_id, g.user[0])
    olio("cache").bump(caching.event_counter(event_id))
    if wants_json():
        return jsonify(attending=change is writes.attend, changed=changed, count=data.attendee_count(event_id))
    return redirect(url_for("events.event", event_id=event_id), code=303)


@events.post("/events/<int:event_id>/attend")
@login_required
def attend(event_id):
    return _attendance(event_id, writes.attend)


@events.post("/events/<int:event_id>/unattend")
@login_required
def unattend(event_id):
    return _attendance(event_id, writes.unattend)


@events.post("/events/<int:event_id>/comments")
@login_required
def add_comment(event_id):
    form = forms.comment(request.form)
    if not form.ok:
        return _event_page(event_id, 422, comment_form=form)
    comment_id = writes.add_comment(event_id, g.user[0], form.clean["rating"], form.clean["comment"])
    olio("cache").bump(caching.event_counter(event_id))
    return redirect(url_for("events.event", event_id=event_id, _anchor=f"comment-{comment_id}"), code=303)


@events.route("/events/<int:event_id>/comments/<int:comment_id>/edit", methods=["GET", "POST"])
@login_required
def edit_comment(event_id, comment_id):
    comment = data.comment(comment_id)
    if comment["event_id"] != event_id:
        abort(404)
    if comment["user_id"] != g.user[0]:
        raise writes.Refused("only its author may change or delete a comment", status=403)
    if request.method == "GET":
        form = forms.Form({})
        form.values = {"comment": comment["comment"], "rating": str(comment["rating"])}
        return render_template("comment_form.html", form=form, comment=comment)
    form = forms.comment(request.form)
    if not form.ok:
        return render_template("comment_form.html", form=form, comment=comment), 422
    writes.edit_comment(event_id, comment_id, g.user[0], form.clean["rating"], form.clean["comment"])
    olio("cache").bump(caching.event_counter(event_id))
    return redirect(url_for("events.event", event_id=event_id, _anchor=f"comment-{comment_id}"), code=303)


@events.post("/events/<int:event_id>/comments/<int:comment_id>/delete")
@login_required
def delete_comment(event_id, comment_id):
    writes.delete_comment(event_id, comment_id, g.user[0])
    olio("cache").bump(caching.event_counter(event_id))
    if wants_json():
        return jsonify(deleted=comment_id)
    return redirect(url_for("events.event", event_id=event_id, _anchor="comments"), code=303)
