"""Olio's data model: the dataclasses `sprout.store` persists (olio-spec.md, "Data model").

Relations that pages follow one at a time (an event's creator, attendees, comments, tags,
friendships) are plain integer ids with an index, so loading an event never drags in its
attendees; values owned by one row (an address, an image, a document) are nested dataclasses,
saved with their owner and loaded with it in one query per type.

Two denormalized fields keep every page's query on one table (the store has no joins):
`Event.zip` copies the address's zip code for the home page's zip filter, and `Tag.refcount`
counts the tag's events for the tag cloud (Olio kept the same counter).
"""

from dataclasses import dataclass
from datetime import date, datetime

import sprout.store as store


@dataclass
class Address:
    street1: str
    street2: str
    city: str
    state: str
    zip: str
    country: str
    latitude: float
    longitude: float


@dataclass
class Image:
    """An uploaded (or loaded) picture in the file store, and its thumbnail's file name."""
    filename: str
    content_type: str
    size: int
    width: int
    height: int
    thumbnail: str


@dataclass
class Document:
    """An uploaded event document (a PDF) in the file store."""
    filename: str
    content_type: str
    size: int


@dataclass
class User:
    username: str = store.field(unique=True)
    password: str = ""  # "salt$sha256hex" (see olio.auth)
    firstname: str = ""
    lastname: str = ""
    email: str = ""
    telephone: str = ""
    summary: str = ""
    timezone: str = "UTC"
    created_at: datetime | None = None
    updated_at: datetime | None = None
    address: Address | None = None
    image: Image | None = None


@dataclass
class Event:
    title: str
    summary: str
    description: str
    telephone: str
    user_id: int = store.field(index=True)  # the creator
    address: Address | None = None
    zip: str = store.field(index=True, default="")  # = address.zip
    image: Image | None = None
    document: Document | None = None
    event_timestamp: datetime | None = store.field(index=True, default=None)
    event_date: date | None = store.field(index=True, default=None)
    created_at: datetime | None = store.field(index=True, default=None)
    total_score: int = 0
    num_votes: int = 0
    disabled: bool = False


@dataclass
class Comment:
    user_id: int = store.field(index=True)
    event_id: int = store.field(index=True)
    rating: int = 3
    comment: str = ""
    created_at: datetime | None = None
    updated_at: datetime | None = None


@dataclass
class Attendance:
    event_id: int = store.field(index=True)
    user_id: int = store.field(index=True)


@dataclass
class Invite:
    """A friend request from `user_id` to `target_id`; accepted, it is a friendship."""
    user_id: int = store.field(index=True)
    target_id: int = store.field(index=True)
    is_accepted: bool = False


@dataclass
class Tag:
    name: str = store.field(unique=True)
    refcount: int = store.field(index=True, default=0)


@dataclass
class Tagging:
    tag_id: int = store.field(index=True)
    event_id: int = store.field(index=True)


ALL = (Address, Image, Document, User, Event, Comment, Attendance, Invite, Tag, Tagging)
