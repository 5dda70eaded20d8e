"""Code Zygotes (ol.yaml's `preload`): lambdas whose code differs only in their settings files
share one Zygote that imported their code, without any lambda's settings; each sandbox forked
from it reads its own. Different code never shares it; a preload that fails costs nothing but
the sharing; bad `preload` sections are refused at upload."""

import time

import pytest

from conftest import targz, zygote_nodes
from sprout.client import SproutError

APP = '''
import os
TOKEN = os.urandom(8).hex()  # which process imported this module
PREPARED = None
STATE = []

def prepare():
    global PREPARED
    PREPARED = {"settings_seen": os.path.exists("/handler/site.txt"), "environment": os.environ.get("SITE_NAME")}

def broken():
    raise RuntimeError("prepare failed on purpose")
'''

F = '''
import sys
PRELOADED = "app" in sys.modules
import app

def f(event):
    event = event or {}
    if "append" in event:
        app.STATE.append(event["append"])
    return {"preloaded": PRELOADED, "token": app.TOKEN, "prepared": app.PREPARED, "state": app.STATE,
            "site": open("/handler/site.txt").read()}
'''

OL_YAML = '''
reuse-sandbox: false
environment:
  SITE_NAME: from-ol-yaml
preload:
  modules: [app]
  call: app:{call}
  settings: [site.txt]
'''


def site(worker, name, text, app=APP, call="prepare"):
    files = {"f.py": F, "app.py": app, "site.txt": text, "ol.yaml": OL_YAML.format(call=call)}
    return worker.client.upload(name, targz(files))


def run_until_preloaded(worker, name, event=None, wait=20.0):
    """Run `name` until a sandbox forked from its code Zygote answers (the first cold starts
    fork from the package Zygote while the code Zygote is made in the background)."""
    deadline = time.time() + wait
    while True:
        out = worker.client.run(name, event)
        if out["preloaded"] or time.time() > deadline:
            return out
        time.sleep(0.2)


def test_sites_of_one_code_share_a_zygote_that_never_saw_their_settings(make_worker):
    w = make_worker()
    site(w, "site-a", "settings of A")
    site(w, "site-b", "settings of B")
    first = w.client.run("site-a")
    assert first["site"] == "settings of A"
    a = run_until_preloaded(w, "site-a")
    assert a["preloaded"], f"no sandbox was forked from a code Zygote\n{w.log()[-3000:]}"
    assert a["site"] == "settings of A"
    # Made from the code without any lambda's settings files, and without its environment.
    assert a["prepared"] == {"settings_seen": False, "environment": None}
    b = w.client.run("site-b")
    assert b["preloaded"] and b["token"] == a["token"], "site-b has a code Zygote of its own"
    assert b["site"] == "settings of B"
    # Each sandbox is its own copy: what one handler changes no other sees.
    assert w.client.run("site-a", {"append": "a"})["state"] == ["a"]
    assert w.client.run("site-b")["state"] == []
    stats = w.client.stats()
    assert stats["import_cache"]["code_zygote_hits"] >= 3
    codes = [n for n in zygote_nodes(stats) if n["code"]]
    assert len(codes) == 1 and codes[0]["adds"][0].startswith("code:")


def test_different_code_or_packages_never_share_a_code_zygote(make_worker):
    w = make_worker()
    site(w, "site-a", "A")
    site(w, "other", "A", app=APP + "\n# another version of the code\n")
    a = run_until_preloaded(w, "site-a")
    other = run_until_preloaded(w, "other")
    assert a["preloaded"] and other["preloaded"]
    assert a["token"] != other["token"]


def test_a_failing_preload_leaves_the_lambda_serving(make_worker):
    w = make_worker()
    site(w, "broken", "settings", call="broken")
    for _ in range(8):
        out = w.client.run("broken")
        assert out["site"] == "settings" and not out["preloaded"]
        time.sleep(0.1)
    deadline = time.time() + 20  # the failure is the background build's: wait for it on a busy host
    while "prepare failed on purpose" not in w.log() and time.time() < deadline:
        time.sleep(0.2)
    assert "prepare failed on purpose" in w.log()
    stats = w.client.stats()["import_cache"]
    assert stats["zygote_creation_failures"] >= 1 and stats["code_zygote_hits"] == 0
    # Tried once per back-off period, not at every cold start.
    assert w.log().count("a code Zygote failed to start") == 1


def test_the_shared_copy_goes_with_the_last_lambda_holding_it(make_worker):
    w = make_worker()
    site(w, "site-a", "A")
    site(w, "site-b", "B")
    shared = w.dir / "registry" / ".shared"
    copies = [p for p in shared.iterdir() if not p.name.startswith(".")]
    assert len(copies) == 1
    assert not (copies[0] / "site.txt").exists() and (copies[0] / "app.py").exists()
    run_until_preloaded(w, "site-a")
    w.client.delete("site-a")
    assert copies[0].exists(), "site-b still holds it"
    w.client.delete("site-b")
    deadline = time.time() + 10
    while copies[0].exists() and time.time() < deadline:
        time.sleep(0.1)
    assert not copies[0].exists()


@pytest.mark.parametrize("preload, reason", [
    ("preload: {}\n", "name the modules to import"),
    ("preload:\n  modules: [app]\n  settings: [../etc]\n", "must be a path inside the lambda"),
    ("preload:\n  modules: [app]\n  call: app\n", "must be module:function"),
])
def test_a_bad_preload_is_refused_at_upload(make_worker, preload, reason):
    w = make_worker()
    with pytest.raises(SproutError) as refused:
        w.client.upload("bad", targz({"f.py": F, "app.py": APP, "site.txt": "x", "ol.yaml": preload}))
    assert refused.value.code == "invalid_lambda_config" and reason in str(refused.value)
    assert "bad" not in str(w.client.list())



def test_a_restarted_worker_shares_its_lambdas_code_again(make_worker):
    w = make_worker()
    site(w, "site-a", "A")
    w.stop()
    w.start()
    copies = [p for p in (w.dir / "registry" / ".shared").iterdir() if not p.name.startswith(".")]
    assert len(copies) == 1 and not (copies[0] / "site.txt").exists()
    out = run_until_preloaded(w, "site-a")
    assert out["preloaded"] and out["site"] == "A"
