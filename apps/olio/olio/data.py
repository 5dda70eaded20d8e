"""Olio's reads: every query the pages make, through `sprout.store`, answered as plain dicts.

All data access lives here and in `olio.writes` (the changes); pages never touch the store,
so a change of storage touches only these two modules. Results are dicts (``id`` plus the
row's fields; nested addresses and images as dicts; never a password hash) because pages need
row ids, which the store keeps out of the objects, and because `olio.cache` pickles them.

Connections: one `sprout.store.Database` per thread and per process, opened on first use.
Gunicorn and Sprout's Zygotes fork after the app is imported, so a database inherited from a
parent process is never used (nor closed: closing would end the parent's session too), and
a connection that failed is dropped so that the next request opens a fresh one. Tables are
created on first use (several processes may race to create them: retried).

Dates and times are naive and mean UTC (the loader writes them so too).
"""

import dataclasses
import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import sprout.store as store

from . import models
from .models import Attendance, Comment, Event, Invite, Tag, Tagging, User

PER_PAGE = 10  # events per page on the home page and in tag search
TAG_CLOUD_SIZE = 50
ATTENDEES_SHOWN = 20
RECENT_EVENTS = 10

NotFound = store.NotFound
StoreError = store.StoreError

_url = None
_local = threading.local()
_inherited = []  # databases of a parent process: kept, so no finalizer closes them


def configure(url):
    """Use the database at `url` (a sprout.store URL) from now on."""
    global _url
    _url = url


def db():
    """This thread's database, opened (and its tables made) on first use in this process."""
    state = getattr(_local, "state", None)
    if state is not None and state[0] == os.getpid():
        return state[1]
    if state is not None:
        _inherited.append(state[1])
    database = _open(_url)
    _local.state = (os.getpid(), database)
    return database


def forget_connection():
    """Drop this thread's database after an error (the next use opens a new one)."""
    state = getattr(_local, "state", None)
    _local.state = None
    if state is not None and state[0] == os.getpid():
        try:
            state[1].close()
        except Exception:
            pass


def _open(url, attempts=5):
    if url is None:
        raise store.ConnectError("olio.data.configure(url) was not called")
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite://"):].split("?")[0]).parent.mkdir(parents=True, exist_ok=True)
    database = store.open(url)
    for attempt in range(attempts):
        try:
            for cls in models.ALL:
                database.table(cls)
            return database
        except Exception:  # another process creating the same tables at the same moment
            if attempt == attempts - 1:
                database.close()
                raise
            time.sleep(0.05 * (attempt + 1))


def now():
    return datetime.now(UTC).replace(tzinfo=None)


def row(obj, table=None):
    """A stored object as a dict: its row id (when it has one) and its fields."""
    d = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    for name, value in d.items():
        if dataclasses.is_dataclass(value):
            d[name] = dataclasses.asdict(value)
    d.pop("password", None)
    if table is not None:
        d["id"] = table.id_of(obj)
    return d


def _rows(table, objs):
    return [row(o, table) for o in objs]


def table(cls):
    return db().table(cls)


# ---------------------------------------------------------------- events

ORDERS = ("event_date", "created_at")


def upcoming_events(zip_code=None, day=None, order="event_date", page=1):
    """(events, total): page `page` of the events still to come, optionally only those at
    `zip_code` and on `day`, soonest first (or newest first with order="created_at")."""
    events = table(Event)
    f = events.fields
    where = (f.event_timestamp >= now()) & (f.disabled == False)  # noqa: E712 -- a condition
    if zip_code:
        where &= f.zip == zip_code
    if day is not None:
        where &= f.event_date == day
    matching = events.query(where)  # counted unordered: sprout.store keeps ORDER BY in COUNT(*)
    ordered = matching.order_by(f.created_at.desc() if order == "created_at" else f.event_timestamp)
    found = ordered.offset((page - 1) * PER_PAGE).limit(PER_PAGE).all()
    return _rows(events, found), matching.count()


def tag_cloud():
    """[(name, number of events)] of the TAG_CLOUD_SIZE most used tags, by name."""
    tags = table(Tag)
    top = tags.query(tags.fields.refcount > 0).order_by(tags.fields.refcount.desc()).limit(TAG_CLOUD_SIZE).all()
    return sorted((t.name, t.refcount) for t in top)


def events_tagged(name, page=1):
    """(events, total): page `page` of the events tagged `name`, newest first."""
    tags, taggings = table(Tag), table(Tagging)
    tag = tags.query(tags.fields.name == name).first()
    if tag is None:
        return [], 0
    matching = taggings.query(taggings.fields.tag_id == tags.id_of(tag))
    newest = matching.order_by(taggings.fields.event_id.desc())
    ids = [t.event_id for t in newest.offset((page - 1) * PER_PAGE).limit(PER_PAGE).all()]
    events = table(Event)
    found = events.get_many(ids)
    return [row(found[i], events) for i in ids if i in found], matching.count()


def event_detail(event_id):
    """Everything the event page shows (NotFound if there is no such event): the event, its
    creator, tags, up to ATTENDEES_SHOWN attendees and their number, and its comments."""
    events, users = table(Event), table(User)
    event = row(events.get(event_id), events)
    attendance = table(Attendance)
    going = attendance.query(attendance.fields.event_id == event_id)
    attendee_ids = [a.user_id for a in going.limit(ATTENDEES_SHOWN).all()]
    comments_table = table(Comment)
    comments = _rows(comments_table, comments_table.query(comments_table.fields.event_id == event_id)
                     .order_by(comments_table.fields.created_at).all())
    people = users.get_many([event["user_id"], *attendee_ids, *(c["user_id"] for c in comments)])
    brief = {uid: user_brief(user, uid) for uid, user in people.items()}
    for comment in comments:
        comment["author"] = brief.get(comment["user_id"])
    taggings = table(Tagging)
    tag_ids = [t.tag_id for t in taggings.query(taggings.fields.event_id == event_id).all()]
    tag_names = sorted(t.name for t in table(Tag).get_many(tag_ids).values())
    votes = event["num_votes"]
    return {
        "event": event,
        "creator": brief.get(event["user_id"]),
        "tags": tag_names,
        "attendees": [brief[u] for u in attendee_ids if u in brief],
        "attendee_count": going.count(),
        "comments": comments,
        "rating": round(event["total_score"] / votes, 1) if votes else None,
    }


def is_attending(event_id, user_id):
    attendance = table(Attendance)
    f = attendance.fields
    return attendance.query((f.event_id == event_id) & (f.user_id == user_id)).first() is not None


def attendee_count(event_id):
    attendance = table(Attendance)
    return attendance.query(attendance.fields.event_id == event_id).count()


def comment(comment_id):
    """The comment with that id, as a dict (NotFound if none)."""
    comments = table(Comment)
    return row(comments.get(comment_id), comments)


# ---------------------------------------------------------------- people

def user_brief(user, uid):
    """What lists of people show: id, name and thumbnail."""
    return {"id": uid, "username": user.username, "firstname": user.firstname, "lastname": user.lastname,
            "thumbnail": user.image.thumbnail if user.image else None}


def person(user_id):
    """Everything the person page shows to anyone (NotFound if there is no such user): the
    user, their RECENT_EVENTS most recently posted events, and their friends."""
    users, events = table(User), table(Event)
    user = row(users.get(user_id), users)
    posted = events.query(events.fields.user_id == user_id).order_by(events.fields.created_at.desc())
    friend_ids = sorted(friends_of(user_id))
    friends = users.get_many(friend_ids)
    return {
        "user": user,
        "events": _rows(events, posted.limit(RECENT_EVENTS).all()),
        "friends": [user_brief(friends[i], i) for i in friend_ids if i in friends],
    }


def friends_of(user_id):
    """Ids of the user's friends: accepted invites, in either direction."""
    invites = table(Invite)
    f = invites.fields
    accepted = invites.query(((f.user_id == user_id) | (f.target_id == user_id)) & (f.is_accepted == True)).all()  # noqa: E712
    return {i.target_id if i.user_id == user_id else i.user_id for i in accepted}


def friend_requests(user_id):
    """(incoming, outgoing): people who asked `user_id` to be friends, and people they asked,
    not yet answered."""
    invites, users = table(Invite), table(User)
    f = invites.fields
    pending = f.is_accepted == False  # noqa: E712
    incoming = [i.user_id for i in invites.query((f.target_id == user_id) & pending).all()]
    outgoing = [i.target_id for i in invites.query((f.user_id == user_id) & pending).all()]
    people = users.get_many(incoming + outgoing)
    return ([user_brief(people[i], i) for i in incoming if i in people],
            [user_brief(people[i], i) for i in outgoing if i in people])


def invite_between(a, b):
    """The invite from `a` to `b` or from `b` to `a` (an Invite object), or None."""
    invites = table(Invite)
    f = invites.fields
    return invites.query(((f.user_id == a) & (f.target_id == b)) | ((f.user_id == b) & (f.target_id == a))).first()


def relationship(viewer_id, user_id):
    """How the viewer stands to the user: "self", "friends", "invited" (the viewer asked),
    "asked" (the user asked the viewer) or None."""
    if viewer_id == user_id:
        return "self"
    invite = invite_between(viewer_id, user_id)
    if invite is None:
        return None
    if invite.is_accepted:
        return "friends"
    return "invited" if invite.user_id == viewer_id else "asked"


def login_record(username):
    """(id, password hash) of the user named `username`, or None."""
    users = table(User)
    user = users.query(users.fields.username == username).first()
    return None if user is None else (users.id_of(user), user.password)


def username_taken(username):
    users = table(User)
    return users.query(users.fields.username == username).count() > 0


def user_exists(user_id):
    try:
        table(User).get(user_id)
        return True
    except NotFound:
        return False
