"""The loader's rules (olio-spec.md, "Loader rules"): how many rows a scale gives, and every
row, drawn from seeded random streams.

Each table draws from a stream of its own, `random.Random("olio-loader:<seed>:<table>")`
(string seeds are hashed with SHA-512 by `random`, never with Python's randomized `hash`),
so changing how one table is made never shifts the values of another. Dates count from the
reference day (`today`, midnight), never from the clock. Rows are produced in id order:
inserted into fresh tables, row k of a table gets id k.

The rules, and where this loader had to choose:

* users: U given (or 100 x C concurrent users); user i (1-based) is named `user{i}`, its
  password is `str(i)`, hashed as the app hashes it (`olio.auth.hash_password`, salted
  SHA-256 "salt$hex") with a salt drawn per user; one address and one image each; created
  within the 540 days before the reference day.
* tags = round(5000 (1 - e^(-U/10000)) / (1 + e^(-U/10000))), halves rounded up as Olio's
  Java loader did (Math.round); tag i is named `tag{i}`; tag 1 is the most popular (rank 0).
* friends: every user gets 2-28 friends. Each user draws a target 2-28; "stubs" (a user
  repeated target times) are shuffled and paired, dropping self-pairs and repeats; users
  left with fewer than 2 are paired with random users below 28. A friendship is ONE Invite
  row (user_id -> target_id, is_accepted), read by the app in either direction; rows are
  sorted by (user_id, target_id).
* events = 3 x tags, each created by a random user; title 20-100, summary 500-1024,
  description 1024-4096 characters; the event day 0-540 days after the reference day, at
  7:00-21:45 on a quarter hour; created within the 540 days before the reference day; an
  address (Event.zip = its zip), an image and a PDF document each.
* taggings: 1-7 distinct tags per event, each drawn by rank from a negative exponential of
  mean 0.1 x tags (ranks past the last tag are drawn again); Tag.refcount = its taggings.
* attendances: 10-100 distinct random users per event, in user id order.
* comments: 0-20 per event by random users, 250-1024 characters, ratings 2-5, dated between
  the event's creation and the reference day; Event.total_score and num_votes are their sum
  and count.

Small loads (--allow-small, below Cloudstone's 1,000 users): counts that cannot be met are
capped (attendees at the number of users, friends at users - 1, tags per event at the
number of tags).
"""

import math
import random
from datetime import datetime, time, timedelta

from . import loader_text as text
from .models import Address, Attendance, Comment, Document, Event, Image, Invite, Tag, Tagging, User

try:
    from olio.auth import hash_password
except ImportError:  # until olio.auth exists: the same definition
    import hashlib

    def hash_password(plain, salt):
        """Salted SHA-256 as "salt$hex" (olio.auth's definition)."""
        return f"{salt}${hashlib.sha256((salt + plain).encode()).hexdigest()}"

DAYS = 540  # events up to DAYS ahead; rows created up to DAYS before the reference day
FRIENDS = (2, 28)
TAGS_PER_EVENT = (1, 7)
ATTENDEES = (10, 100)
COMMENTS = (0, 20)
RATINGS = (2, 5)
COMMENT_CHARS = (250, 1024)
TITLE_CHARS = (20, 100)
SUMMARY_CHARS = (500, 1024)
DESCRIPTION_CHARS = (1024, 4096)
USER_SUMMARY_CHARS = (50, 300)


def tag_count(users):
    x = math.exp(-users / 10000)
    return math.floor(5000 * (1 - x) / (1 + x) + 0.5)


def event_count(users):
    return 3 * tag_count(users)


def username(i):
    """The name of loaded user `i` (its password is `str(i)`)."""
    return f"user{i}"


def tag_name(i):
    return f"tag{i}"


class Rows:
    """Every loaded row of one load (seed, users, reference day, files), table by table."""

    def __init__(self, seed, users, today, images, documents):
        self.seed = seed
        self.users = users
        self.tags = tag_count(users)
        self.events = event_count(users)
        self.midnight = datetime.combine(today, time())
        self.images = images
        self.documents = documents
        self.corpus = text.Corpus(self.stream("corpus"))
        self._event_created = []
        self._ratings = None

    def stream(self, table):
        return random.Random(f"olio-loader:{self.seed}:{table}")

    def _created(self, rng):
        """A moment (whole seconds) within the DAYS days before the reference day."""
        return self.midnight - timedelta(seconds=rng.randint(1, DAYS * 86400))

    def _address(self, rng):
        return Address(*text.address_fields(rng))

    def _image(self, rng):
        stored = rng.choice(self.images)
        return Image(stored.filename, "image/jpeg", stored.size, stored.width, stored.height, stored.thumbnail)

    # ------------------------------------------------------------------ users and friends

    def user_rows(self):
        rng, salts = self.stream("users"), self.stream("salts")
        for i in range(1, self.users + 1):
            first, last = text.person_name(rng)
            created = self._created(rng)
            salt = f"{salts.getrandbits(64):016x}"
            yield User(
                username=username(i), password=hash_password(str(i), salt),
                firstname=first, lastname=last, email=f"{username(i)}@example.com",
                telephone=text.telephone(rng), summary=self.corpus.text(rng, *USER_SUMMARY_CHARS),
                timezone=rng.choice(text.TIMEZONES), created_at=created, updated_at=created,
                address=self._address(rng), image=self._image(rng),
            )

    def friendships(self):
        """[(user_id, target_id)], one pair per friendship, sorted."""
        rng, n = self.stream("invites"), self.users
        low, high = min(FRIENDS[0], n - 1), min(FRIENDS[1], n - 1)
        targets = [rng.randint(low, high) for _ in range(n)]
        stubs = [u for u in range(1, n + 1) for _ in range(targets[u - 1])]
        rng.shuffle(stubs)
        degree = [0] * (n + 1)
        pairs = []  # (user_id, target_id) as drawn
        known = set()  # low id * (n + 1) + high id of each pair: one int per friendship

        def befriend(a, b):
            pairs.append((a, b))
            known.add(a * (n + 1) + b if a < b else b * (n + 1) + a)
            degree[a] += 1
            degree[b] += 1

        def friends(a, b):
            return (a * (n + 1) + b if a < b else b * (n + 1) + a) in known

        for k in range(0, len(stubs) - 1, 2):
            a, b = stubs[k], stubs[k + 1]
            if a != b and not friends(a, b):
                befriend(a, b)
        for u in range(1, n + 1):
            tries = 0
            while degree[u] < low:
                v = rng.randint(1, n) if tries < 1000 else next(
                    (w for w in range(1, n + 1) if w != u and degree[w] < high and not friends(u, w)), None)
                if v is None:
                    raise ValueError(f"user {u} cannot get {low} friends among {n} users")
                if v != u and degree[v] < high and not friends(u, v):
                    befriend(u, v)
                tries += 1
        width = n + 1  # sorted as ints: several times faster than tuples
        return [divmod(key, width) for key in sorted(a * width + b for a, b in pairs)]

    def invite_rows(self, pairs):
        for a, b in pairs:
            yield Invite(user_id=a, target_id=b, is_accepted=True)

    # ------------------------------------------------------------------ tags and events

    def taggings(self):
        """[[tag id]] per event (in event order): 1-7 distinct tags, popular ones first."""
        rng = self.stream("taggings")
        mean = 0.1 * self.tags
        out = []
        for _ in range(self.events):
            k = min(rng.randint(*TAGS_PER_EVENT), self.tags)
            chosen = []
            while len(chosen) < k:
                rank = int(rng.expovariate(1 / mean))
                if rank < self.tags and rank + 1 not in chosen:
                    chosen.append(rank + 1)
            out.append(chosen)
        return out

    def tag_rows(self, taggings):
        refcount = [0] * (self.tags + 1)
        for tags in taggings:
            for t in tags:
                refcount[t] += 1
        for i in range(1, self.tags + 1):
            yield Tag(name=tag_name(i), refcount=refcount[i])

    def tagging_rows(self, taggings):
        for event_id, tags in enumerate(taggings, start=1):
            for t in tags:
                yield Tagging(tag_id=t, event_id=event_id)

    def ratings(self):
        """[[rating]] per event: how many comments each event has, and their ratings."""
        if self._ratings is None:
            rng = self.stream("ratings")
            self._ratings = [[rng.randint(*RATINGS) for _ in range(rng.randint(*COMMENTS))]
                             for _ in range(self.events)]
        return self._ratings

    def event_rows(self):
        rng, ratings = self.stream("events"), self.ratings()
        self._event_created = []
        for i in range(self.events):
            day = self.midnight.date() + timedelta(days=rng.randint(0, DAYS))
            starts = datetime.combine(day, time(rng.randint(7, 21), rng.choice((0, 15, 30, 45))))
            created = self._created(rng)
            self._event_created.append(created)
            address = self._address(rng)
            document = rng.choice(self.documents)
            yield Event(
                title=self.corpus.text(rng, *TITLE_CHARS),
                summary=self.corpus.text(rng, *SUMMARY_CHARS),
                description=self.corpus.text(rng, *DESCRIPTION_CHARS),
                telephone=text.telephone(rng), user_id=rng.randint(1, self.users),
                address=address, zip=address.zip, image=self._image(rng),
                document=Document(document.filename, "application/pdf", document.size),
                event_timestamp=starts, event_date=day, created_at=created,
                total_score=sum(ratings[i]), num_votes=len(ratings[i]),
            )

    def attendance_counts(self):
        return self._attendance_plan()[0]

    def _attendance_plan(self):
        rng = self.stream("attendances")
        counts = [min(rng.randint(*ATTENDEES), self.users) for _ in range(self.events)]
        return counts, rng

    def attendance_rows(self):
        """Batches (one per event) of Attendance rows."""
        counts, rng = self._attendance_plan()
        for event_id, k in enumerate(counts, start=1):
            yield [Attendance(event_id=event_id, user_id=u) for u in sorted(rng.sample(range(1, self.users + 1), k))]

    def comment_rows(self):
        """Batches (one per event) of Comment rows; needs event_rows() to have run."""
        if len(self._event_created) != self.events:
            raise RuntimeError("comments are made after the events (their dates follow the events')")
        rng = self.stream("comments")
        for event_id, ratings in enumerate(self.ratings(), start=1):
            created = self._event_created[event_id - 1]
            span = max(1, int((self.midnight - created).total_seconds()))
            batch = []
            for rating in ratings:
                at = created + timedelta(seconds=rng.randint(1, span))
                batch.append(Comment(user_id=rng.randint(1, self.users), event_id=event_id, rating=rating,
                                     comment=self.corpus.text(rng, *COMMENT_CHARS), created_at=at, updated_at=at))
            yield batch
