"""`sprout.platform` on its own (no worker): the services a sandbox is told of, and how
sprout.cache and sprout.store take a service's address from its name."""

import pytest

import sprout
from sprout.store import _with_service_address

ENV = {"SPROUT_SERVICE_OLIO_DB": "10.224.0.1:5433", "SPROUT_SERVICE_CACHE": "10.224.0.2:11211", "PATH": "/bin"}


def test_services_come_from_the_environment(monkeypatch):
    assert sprout.services(ENV) == {"olio-db": "10.224.0.1:5433", "cache": "10.224.0.2:11211"}
    assert sprout.service("olio-db", ENV) == ("10.224.0.1", 5433)
    with pytest.raises(KeyError, match="may reach: cache, olio-db"):
        sprout.service("postgres", ENV)
    monkeypatch.setattr("os.environ", {})
    assert sprout.services() == {}


def test_a_store_url_naming_a_service_takes_its_address(monkeypatch):
    monkeypatch.setattr("os.environ", dict(ENV))
    assert _with_service_address("postgresql://olio:pw@olio-db/olio?sslmode=disable") == \
        "postgresql://olio:pw@10.224.0.1:5433/olio?sslmode=disable"
    # A port given, or a host that is no service: left as it is (resolved by /etc/hosts).
    assert _with_service_address("postgresql://olio@olio-db:5432/olio") == "postgresql://olio@olio-db:5432/olio"
    assert _with_service_address("postgresql://olio@db.example/olio") == "postgresql://olio@db.example/olio"


def test_cache_servers_by_service_name(monkeypatch):
    cache = pytest.importorskip("sprout.cache")
    monkeypatch.setattr("os.environ", dict(ENV))
    assert cache.parse_servers("cache") == [("10.224.0.2", 11211)]
    assert cache.parse_servers("cache, 10.0.0.9:11311") == [("10.224.0.2", 11211), ("10.0.0.9", 11311)]
    assert cache.servers_from_env() == [("10.224.0.2", 11211)]
    monkeypatch.setattr("os.environ", {})
    assert cache.servers_from_env() == [("127.0.0.1", 11211)]


def test_invoke_outside_a_sandbox_says_so():
    with pytest.raises(RuntimeError, match="only inside a Sprout sandbox"):
        sprout.invoke("echo", {})
    with pytest.raises(TypeError):
        sprout.invoke("", {})
