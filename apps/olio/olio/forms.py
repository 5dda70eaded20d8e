"""Validation of every form Olio accepts: registration, login, events, comments.

Each function takes the request's fields (and files) and returns a `Form`: `ok`, the cleaned
values in `clean` (model objects where a page saves one), the values as typed in `values`
(to re-render the form with them kept; never a password) and a message per bad field in
`errors`. Uploads are inspected here (by content, see `olio.files`) but only saved by the
page once every field is valid, so a refused form leaves no file behind.

Every text field has a length limit and refuses control characters (PostgreSQL cannot store
a NUL, and no field needs one); HTML needs no special treatment here: templates escape it.
"""

import hashlib
import re
from datetime import date, datetime, time

from .files import BadUpload, inspect_document, inspect_image
from .models import Address, Event, User

USERNAME = re.compile(r"[A-Za-z0-9_.-]{3,25}")
TAG = re.compile(r"[a-z0-9][a-z0-9_.-]{0,29}")
EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
TELEPHONE = re.compile(r"[0-9+()./ -]{0,30}")
ZIP = re.compile(r"[A-Za-z0-9 -]{1,12}")
TIMEZONE = re.compile(r"[A-Za-z_]+(/[A-Za-z0-9_+-]+){0,2}")
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
MAX_TAGS = 20


class Form:
    """One submitted form being checked."""

    def __init__(self, fields, files=None):
        self.fields = fields
        self.files = files or {}
        self.values = {}
        self.errors = {}
        self.clean = {}

    @property
    def ok(self):
        return not self.errors

    def fail(self, name, message):
        self.errors.setdefault(name, message)

    def text(self, name, label, required=True, limit=100, pattern=None, hint="", keep=True):
        """The stripped text of field `name` (None when it is bad; "" when empty and optional)."""
        value = self.fields.get(name, "").strip()
        if keep:
            self.values[name] = value
        if not value:
            if required:
                self.fail(name, f"{label} is required")
                return None
            return ""
        if len(value) > limit:
            self.fail(name, f"{label} is longer than {limit} characters")
        elif CONTROL.search(value):
            self.fail(name, f"{label} contains control characters")
        elif pattern is not None and not pattern.fullmatch(value):
            self.fail(name, f"{label} {hint}")
        else:
            return value
        return None

    def upload(self, name, label, inspect, required=False):
        """The inspected upload of field `name`, or None (no file, or a bad one)."""
        storage = self.files.get(name)
        data = storage.read() if storage is not None else b""
        if not data:
            if required:
                self.fail(name, f"{label} is required")
            return None
        try:
            return inspect(data)
        except BadUpload as e:
            self.fail(name, f"{label}: {e}")
            return None


def pseudo_location(address):
    """(latitude, longitude) within the continental US, derived from the address: the
    stand-in for the geocoding service Olio called (as Olio's own was a fake one)."""
    digest = hashlib.sha256(f"{address.zip}|{address.city}|{address.state}".encode()).digest()
    lat = 25.0 + int.from_bytes(digest[:4], "big") / 2**32 * 24.0
    lon = -124.0 + int.from_bytes(digest[4:8], "big") / 2**32 * 57.0
    return round(lat, 6), round(lon, 6)


def _address(form, required=True):
    street1 = form.text("street1", "Street", required, 100)
    street2 = form.text("street2", "Street (second line)", False, 100)
    city = form.text("city", "City", required, 60)
    state = form.text("state", "State", required, 40)
    zip_code = form.text("zip", "Zip code", required, 12, ZIP, "must be letters, digits, spaces or dashes")
    country = form.text("country", "Country", required, 60)
    if None in (street1, street2, city, state, zip_code, country):
        return None
    address = Address(street1, street2, city, state, zip_code, country, 0.0, 0.0)
    address.latitude, address.longitude = pseudo_location(address)
    return address


def registration(fields, files):
    form = Form(fields, files)
    username = form.text("username", "User name", True, 25, USERNAME, "must be 3-25 letters, digits, '.', '_' or '-'")
    password = form.text("password", "Password", True, 128, keep=False)
    confirm = fields.get("password_confirm", "")
    if password and confirm != fields.get("password", ""):
        form.fail("password_confirm", "The two passwords differ")
    firstname = form.text("firstname", "First name", True, 50)
    lastname = form.text("lastname", "Last name", True, 50)
    email = form.text("email", "E-mail", True, 100, EMAIL, "is not an e-mail address")
    telephone = form.text("telephone", "Telephone", False, 30, TELEPHONE, "may hold only digits, spaces and + ( ) . / -")
    summary = form.text("summary", "About you", False, 2000)
    timezone = form.text("timezone", "Time zone", False, 40, TIMEZONE, "is not a time zone name (like Europe/Paris)") or "UTC"
    address = _address(form)
    image = form.upload("image", "Picture", inspect_image)
    if form.ok:
        form.clean["user"] = User(username=username, password=password, firstname=firstname, lastname=lastname,
                                  email=email, telephone=telephone, summary=summary, timezone=timezone, address=address)
        form.clean["image"] = image
    return form


def login(fields):
    form = Form(fields)
    form.clean["username"] = form.text("username", "User name", True, 100)
    form.clean["password"] = form.text("password", "Password", True, 128, keep=False)
    return form


def parse_tags(text):
    """Tag names of space- or comma-separated `text`: lower case, each once, in order."""
    return list(dict.fromkeys(t for t in re.split(r"[\s,]+", text.lower()) if t))


def event(fields, files):
    form = Form(fields, files)
    title = form.text("title", "Title", True, 100)
    summary = form.text("summary", "Summary", True, 2000)
    description = form.text("description", "Description", True, 10000)
    telephone = form.text("telephone", "Telephone", False, 30, TELEPHONE, "may hold only digits, spaces and + ( ) . / -")
    day = form.text("date", "Date", True, 10, re.compile(r"\d{4}-\d{2}-\d{2}"), "must be written YYYY-MM-DD")
    hour = form.text("time", "Time", True, 5, re.compile(r"\d{1,2}:\d{2}"), "must be written HH:MM (24 hours)")
    timestamp = None
    if day:
        try:
            parsed_day = date.fromisoformat(day)
            if not 2000 <= parsed_day.year <= 2100:
                raise ValueError
        except ValueError:
            form.fail("date", "Date is not a day between 2000 and 2100")
            parsed_day = None
        if parsed_day and hour:
            try:
                timestamp = datetime.combine(parsed_day, time(*map(int, hour.split(":"))))
            except ValueError:
                form.fail("time", "Time is not a time of day")
    tag_text = form.text("tags", "Tags", False, 1000)
    tags = parse_tags(tag_text or "")
    bad = [t for t in tags if not TAG.fullmatch(t)]
    if bad:
        form.fail("tags", f"Tags may hold only letters, digits, '.', '_' and '-' (up to 30): not {', '.join(bad[:3])}")
    elif len(tags) > MAX_TAGS:
        form.fail("tags", f"An event has at most {MAX_TAGS} tags")
    address = _address(form)
    image = form.upload("image", "Image", inspect_image)
    document = form.upload("document", "Document", inspect_document)
    if form.ok:
        form.clean["event"] = Event(title=title, summary=summary, description=description, telephone=telephone,
                                    user_id=0, address=address, zip=address.zip, event_timestamp=timestamp,
                                    event_date=timestamp.date())
        form.clean.update(tags=tags, image=image, document=document)
    return form


def comment(fields):
    form = Form(fields)
    text = form.text("comment", "Comment", True, 4000)
    rating = fields.get("rating", "").strip()
    form.values["rating"] = rating
    if rating not in ("1", "2", "3", "4", "5"):
        form.fail("rating", "Rating must be a whole number from 1 to 5")
    if form.ok:
        form.clean.update(comment=text, rating=int(rating))
    return form
