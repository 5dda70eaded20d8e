"""Olio's changes: every write the pages make, each in one transaction (see `olio.data`).

Each function that changes several rows runs in `Database.atomic`, so all of its rows change
or none do, and a concurrent transaction that conflicts with it (PostgreSQL's SERIALIZABLE)
makes it run again rather than fail. A request that breaks a rule (a second invite, someone
else's comment) raises `Refused` with a message for the user, and nothing is written.
"""

import sqlite3

from .data import NotFound, db, invite_between, now, table, user_exists
from .models import Attendance, Comment, Event, Invite, Tag, Tagging, User

try:
    from psycopg.errors import UniqueViolation
except ImportError:  # SQLite only
    UniqueViolation = sqlite3.IntegrityError


class Refused(Exception):
    """The change breaks one of Olio's rules; the message says which. Nothing was written."""

    def __init__(self, message, status=409):
        super().__init__(message)
        self.status = status


class UsernameTaken(Refused):
    pass


def _atomic(fn, attempts=3):
    """Run `fn` in a transaction; again if a concurrent one inserted the same unique value
    first (fn's own checks then see it)."""
    for attempt in range(attempts):
        try:
            return db().atomic(fn)
        except (sqlite3.IntegrityError, UniqueViolation) as e:
            if "unique" not in str(e).lower() or attempt == attempts - 1:
                raise Refused("a concurrent change conflicted with this one: try again") from e


# ---------------------------------------------------------------- people

def create_user(user):
    """Save a new User; its id. UsernameTaken if the name is in use."""
    users = table(User)

    def insert():
        if users.query(users.fields.username == user.username).count():
            raise UsernameTaken(f"the user name {user.username!r} is taken")
        user.created_at = user.updated_at = now()
        return users.save(user)

    return _atomic(insert)


def invite(user_id, target_id):
    """`user_id` asks `target_id` to be friends."""
    if user_id == target_id:
        raise Refused("you cannot invite yourself")

    def insert():
        if not user_exists(target_id):
            raise NotFound(f"no user {target_id}")
        existing = invite_between(user_id, target_id)
        if existing is not None:
            raise Refused("you are already friends" if existing.is_accepted else "there is already a friend request between you")
        table(Invite).save(Invite(user_id=user_id, target_id=target_id))

    _atomic(insert)


def _pending(sender, receiver):
    invites = table(Invite)
    f = invites.fields
    return invites.query((f.user_id == sender) & (f.target_id == receiver) & (f.is_accepted == False)).first()  # noqa: E712


def approve(user_id, sender_id):
    """`user_id` accepts the friend request `sender_id` sent them."""
    def accept():
        request = _pending(sender_id, user_id)
        if request is None:
            raise Refused("there is no friend request from that user to approve")
        request.is_accepted = True
        table(Invite).save(request)

    _atomic(accept)


def reject(user_id, sender_id):
    """`user_id` turns down the friend request `sender_id` sent them."""
    def remove():
        request = _pending(sender_id, user_id)
        if request is None:
            raise Refused("there is no friend request from that user to reject")
        table(Invite).delete(request)

    _atomic(remove)


def revoke(user_id, target_id):
    """`user_id` withdraws the friend request they sent to `target_id`."""
    def remove():
        request = _pending(user_id, target_id)
        if request is None:
            raise Refused("you have no pending friend request to that user to revoke")
        table(Invite).delete(request)

    _atomic(remove)


# ---------------------------------------------------------------- events

def create_event(event, tag_names):
    """Save a new Event with its tags (made if new, their counts bumped); its id."""
    events, tags, taggings = table(Event), table(Tag), table(Tagging)

    def insert():
        event.created_at = now()
        event_id = events.save(event)
        for name in tag_names:
            tag = tags.query(tags.fields.name == name).first() or Tag(name=name)
            tag.refcount += 1
            tag_id = tags.save(tag)
            taggings.save(Tagging(tag_id=tag_id, event_id=event_id))
        return event_id

    return _atomic(insert)


def _event(event_id):
    return table(Event).get(event_id)


def attend(event_id, user_id):
    """Add `user_id` to the event's attendees; whether they were not already."""
    attendance = table(Attendance)
    f = attendance.fields

    def add():
        _event(event_id)  # NotFound for an unknown event
        if attendance.query((f.event_id == event_id) & (f.user_id == user_id)).count():
            return False
        attendance.save(Attendance(event_id=event_id, user_id=user_id))
        return True

    return _atomic(add)


def unattend(event_id, user_id):
    """Remove `user_id` from the event's attendees; whether they were attending."""
    attendance = table(Attendance)
    f = attendance.fields

    def remove():
        _event(event_id)
        return attendance.query((f.event_id == event_id) & (f.user_id == user_id)).delete() > 0

    return _atomic(remove)


def _rescore(event_id, score_change, vote_change):
    events = table(Event)
    event = events.get(event_id)
    event.total_score += score_change
    event.num_votes += vote_change
    events.save(event)


def add_comment(event_id, user_id, rating, text):
    """A new comment with a rating on the event (its score updated); the comment's id."""
    def insert():
        moment = now()
        comment_id = table(Comment).save(Comment(user_id=user_id, event_id=event_id, rating=rating, comment=text,
                                                  created_at=moment, updated_at=moment))
        _rescore(event_id, rating, 1)
        return comment_id

    return _atomic(insert)


def _own_comment(event_id, comment_id, user_id):
    comment = table(Comment).get(comment_id)
    if comment.event_id != event_id:
        raise NotFound(f"event {event_id} has no comment {comment_id}")
    if comment.user_id != user_id:
        raise Refused("only its author may change or delete a comment", status=403)
    return comment


def edit_comment(event_id, comment_id, user_id, rating, text):
    """The author changes their comment and rating (the event's score follows)."""
    def update():
        comment = _own_comment(event_id, comment_id, user_id)
        change = rating - comment.rating
        comment.rating, comment.comment, comment.updated_at = rating, text, now()
        table(Comment).save(comment)
        _rescore(event_id, change, 0)

    _atomic(update)


def delete_comment(event_id, comment_id, user_id):
    """The author deletes their comment (its rating leaves the event's score)."""
    def remove():
        comment = _own_comment(event_id, comment_id, user_id)
        table(Comment).delete(comment)
        _rescore(event_id, -comment.rating, -1)

    _atomic(remove)
