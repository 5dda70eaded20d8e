"""The README's examples, as `scripts/run-worker.sh` serves them: every lambda of
examples/lambdas deployed to a worker configured as that script configures it (the cache is
its one service), answering as the README says. jinja and visits install their packages
from the package index, as a user's would."""

import pytest

from conftest import EXAMPLES


@pytest.fixture
def examples(make_worker, make_cache_server):
    cache = make_cache_server("sprout", "-t", "1")
    host, port = cache.address
    w = make_worker(network={"allow": [{"name": "cache", "address": f"{host}:{port}"}]},
                    packages={"install_timeout_s": 300})
    for example in sorted(EXAMPLES.iterdir()):
        w.client.deploy(str(example))
    return w


def test_the_readme_examples_answer_as_it_says(examples):
    w = examples
    assert w.client.run("echo", {"hello": "world"}) == {"hello": "world"}
    assert b"Hello, ada!" in w.client.request("GET", "hello", "/ada").body
    with pytest.raises(Exception) as failed:
        w.client.run("fail", 1)
    assert failed.value.status == 500 and "Traceback" in (failed.value.traceback or "")
    assert "Hello, Ada!" in w.client.run("jinja", {"name": "ada"})["greeting"]
    # visits counts in the cache tier, reached through the worker's service "cache" only.
    assert w.client.run("visits", {"page": "home"}) == {"page": "home", "visits": 1}
    assert w.client.run("visits", {"page": "home"}) == {"page": "home", "visits": 2}
    assert w.client.run("visits", {"page": "about"}) == {"page": "about", "visits": 1}
