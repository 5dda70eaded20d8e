"""Olio's settings: one `Config`, from a TOML file and environment overrides.

Where the file comes from, first found wins: the path in `OLIO_CONFIG`; `olio.toml` beside
the `olio` package (how the Sprout lambda carries its settings); none (the defaults). Then
`OLIO_DB`, `OLIO_CACHE`, `OLIO_FILES` and `OLIO_SECRET` override their keys. Unknown keys and
wrong types are errors naming the key, so a typo never silently falls back to a default.
"""

import dataclasses
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
BESIDE_PACKAGE = PACKAGE_DIR.parent / "olio.toml"
ENV = {"db": "OLIO_DB", "cache": "OLIO_CACHE", "files": "OLIO_FILES", "secret": "OLIO_SECRET"}


class ConfigError(ValueError):
    """The configuration file or an override is wrong (the message names the key)."""


@dataclass(frozen=True)
class Config:
    # A sprout.store URL: sqlite:///path.db (embedded) or postgresql://user@host:port/db.
    db: str = "sqlite:///var/lib/olio/olio.db"
    # memcached-protocol servers, "host:port,host:port" (the Sprout cache or memcached);
    # empty turns caching off.
    cache: str = ""
    # The file store: uploaded and loaded images, thumbnails, documents.
    files: str = "/var/lib/olio/files"
    # Signs session cookies; every process serving the site must share it. Empty: a key is
    # made once and kept in the file store (`.secret`).
    secret: str = ""
    # URL prefixes of the static assets and of the file store.
    static_url: str = "/static"
    files_url: str = "/files"

    @property
    def cache_servers(self):
        """[(host, port)] of `cache`, or [] when caching is off."""
        servers = []
        for item in filter(None, (s.strip() for s in self.cache.split(","))):
            host, sep, port = item.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ConfigError(f"cache: {item!r} is not host:port")
            servers.append((host, int(port)))
        return servers


def load(path=None, env=None):
    """The configuration: `path` (or the file found as the module docstring says), then the
    environment's overrides."""
    env = os.environ if env is None else env
    if path is None:
        path = env.get("OLIO_CONFIG") or (BESIDE_PACKAGE if BESIDE_PACKAGE.exists() else None)
    values = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                values = tomllib.load(f)
        except OSError as e:
            raise ConfigError(f"cannot read the Olio configuration {path}: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: {e}") from None
    known = {f.name: f for f in dataclasses.fields(Config)}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"{path}: unknown key {key!r} (known: {', '.join(known)})")
        if not isinstance(value, str):
            raise ConfigError(f"{path}: {key} must be a string, not {type(value).__name__}")
    for key, var in ENV.items():
        if env.get(var) is not None:
            values[key] = env[var]
    config = Config(**values)
    config.cache_servers  # noqa: B018 -- checked now, not on the first request
    return config
