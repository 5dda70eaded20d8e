"""Deterministic made-up content for the loader: words, names, places, phone numbers, texts.

Everything here draws only from the `random.Random` it is given, so a seeded stream gives
the same values on every run and machine. Texts of exact lengths are slices of one corpus of
sentences made once per load (`Corpus`): cutting a slice is as cheap as a string copy, which
matters when a load writes ~200 MB of comments and descriptions.
"""

WORDS = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut "
    "labore et dolore magna aliqua enim ad minim veniam quis nostrud exercitation ullamco laboris "
    "nisi aliquip ex ea commodo consequat duis aute irure in reprehenderit voluptate velit esse "
    "cillum fugiat nulla pariatur excepteur sint occaecat cupidatat non proident sunt culpa qui "
    "officia deserunt mollit anim id est laborum music festival concert market gallery garden "
    "river park tasting workshop lecture meetup picnic parade dance theater film night morning "
    "evening weekend family friends neighbors community local open free tickets food wine beer "
    "coffee bread cheese art craft books poetry jazz blues folk rock choir orchestra quartet "
    "exhibition tour walk run race ride sail climb hike swim yoga chess games trivia comedy "
    "lights lanterns fireworks harvest spring summer autumn winter sunset riverside downtown "
    "square hall library museum school club stadium arena beach harbor bridge hill valley"
).split()

FIRST_NAMES = (
    "Ada Alan Alice Anil Barbara Ben Carla Chen Dana David Elena Emil Fatima Frank Grace Hana "
    "Ivan Jia Joan John Karl Kiri Lars Leila Maria Mateo Mei Nadia Noah Olga Omar Priya Quinn "
    "Rosa Sam Sara Tariq Tom Uma Vera Wei Xavier Yara Yusuf Zoe"
).split()

LAST_NAMES = (
    "Abbott Baker Costa Dubois Eriksen Fischer Garcia Hoffmann Ibrahim Jensen Kowalski Lopez "
    "Moreau Nakamura Okafor Petrov Quist Rossi Schmidt Tanaka Ueda Varga Weber Xu Yilmaz Zhang "
    "Andersen Bianchi Chen Demir Evans Ferreira Gupta Horvat Ito Jung Kim Larsen Martin Novak"
).split()

STREET_NAMES = (
    "Oak Maple Cedar Pine Elm Walnut Chestnut Willow Birch Spruce Main Market Church Mill "
    "Park Lake Hill River Spring Sunset Highland Meadow Forest Orchard Harbor Station Union"
).split()

STREET_KINDS = ("St", "Ave", "Blvd", "Rd", "Lane", "Way", "Drive", "Court", "Place")

# (city, state, first zip code of the city, latitude, longitude): an address picks a city
# and one of its ten zip codes, so the home page's zip filter finds events.
CITIES = (
    ("San Francisco", "CA", 94100, 37.7749, -122.4194), ("Oakland", "CA", 94600, 37.8044, -122.2712),
    ("Berkeley", "CA", 94700, 37.8715, -122.2730), ("San Jose", "CA", 95110, 37.3382, -121.8863),
    ("Los Angeles", "CA", 90010, 34.0522, -118.2437), ("San Diego", "CA", 92100, 32.7157, -117.1611),
    ("Sacramento", "CA", 95810, 38.5816, -121.4944), ("Portland", "OR", 97200, 45.5152, -122.6784),
    ("Seattle", "WA", 98100, 47.6062, -122.3321), ("Boise", "ID", 83700, 43.6150, -116.2023),
    ("Salt Lake City", "UT", 84100, 40.7608, -111.8910), ("Denver", "CO", 80200, 39.7392, -104.9903),
    ("Phoenix", "AZ", 85000, 33.4484, -112.0740), ("Albuquerque", "NM", 87100, 35.0844, -106.6504),
    ("Austin", "TX", 78700, 30.2672, -97.7431), ("Dallas", "TX", 75200, 32.7767, -96.7970),
    ("Houston", "TX", 77000, 29.7604, -95.3698), ("Kansas City", "MO", 64100, 39.0997, -94.5786),
    ("Minneapolis", "MN", 55400, 44.9778, -93.2650), ("Chicago", "IL", 60600, 41.8781, -87.6298),
    ("Madison", "WI", 53700, 43.0731, -89.4012), ("Detroit", "MI", 48200, 42.3314, -83.0458),
    ("Columbus", "OH", 43200, 39.9612, -82.9988), ("Nashville", "TN", 37200, 36.1627, -86.7816),
    ("Atlanta", "GA", 30300, 33.7490, -84.3880), ("Miami", "FL", 33100, 25.7617, -80.1918),
    ("Orlando", "FL", 32800, 28.5383, -81.3792), ("Charlotte", "NC", 28200, 35.2271, -80.8431),
    ("Raleigh", "NC", 27600, 35.7796, -78.6382), ("Richmond", "VA", 23200, 37.5407, -77.4360),
    ("Washington", "DC", 20000, 38.9072, -77.0369), ("Baltimore", "MD", 21200, 39.2904, -76.6122),
    ("Philadelphia", "PA", 19100, 39.9526, -75.1652), ("Pittsburgh", "PA", 15200, 40.4406, -79.9959),
    ("New York", "NY", 10000, 40.7128, -74.0060), ("Buffalo", "NY", 14200, 42.8864, -78.8784),
    ("Boston", "MA", 2100, 42.3601, -71.0589), ("Providence", "RI", 2900, 41.8240, -71.4128),
    ("Burlington", "VT", 5400, 44.4759, -73.2121), ("Portland", "ME", 4100, 43.6591, -70.2568),
)

TIMEZONES = (
    "America/Los_Angeles", "America/Denver", "America/Phoenix", "America/Chicago",
    "America/New_York", "UTC", "Europe/London", "Europe/Berlin", "Asia/Tokyo", "Australia/Sydney",
)


class Corpus:
    """A long text of made-up sentences; `text` cuts exact-length slices of it."""

    def __init__(self, rng, size=1 << 20):
        parts = []
        length = 0
        while length < size:
            words = rng.choices(WORDS, k=rng.randint(6, 16))
            sentence = " ".join(words).capitalize() + ". "
            parts.append(sentence)
            length += len(sentence)
        self.body = "".join(parts)

    def text(self, rng, low, high):
        """A text of `low`..`high` characters (uniform), starting at a word and ending
        without a trailing space."""
        length = rng.randint(low, high)
        if length + 64 > len(self.body):
            raise ValueError(f"a text of {length} characters is longer than the corpus")
        start = rng.randrange(len(self.body) - length - 64)
        start = self.body.index(" ", start) + 1  # words are short: the corpus has room left
        out = self.body[start:start + length]
        out = out[0].upper() + out[1:]
        if out[-1] == " ":
            out = out[:-1] + "."
        return out


def person_name(rng):
    return rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)


def telephone(rng):
    return f"{rng.randint(200, 989)}-{rng.randint(200, 999)}-{rng.randint(0, 9999):04d}"


def address_fields(rng):
    """The fields of one street address (Address's, in its order)."""
    city, state, first_zip, lat, lon = rng.choice(CITIES)
    street1 = f"{rng.randint(1, 9999)} {rng.choice(STREET_NAMES)} {rng.choice(STREET_KINDS)}"
    street2 = f"Apt {rng.randint(1, 400)}" if rng.random() < 0.2 else ""
    zip_code = f"{first_zip + rng.randint(0, 9):05d}"
    # Within a few kilometres of the city's centre, rounded as a geocoder would give it.
    latitude = round(lat + rng.uniform(-0.05, 0.05), 6)
    longitude = round(lon + rng.uniform(-0.05, 0.05), 6)
    return street1, street2, city, state, zip_code, "USA", latitude, longitude
