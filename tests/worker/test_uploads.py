"""Bad uploads are refused at upload with 400 (or 413) and a stable code; nothing is kept."""

import io
import tarfile

import pytest

import sprout
from conftest import targz


def refused(worker, name, archive):
    with pytest.raises(sprout.SproutError) as err:
        worker.client.upload(name, archive)
    return err.value


def tar_with(entries):
    """A tar.gz built from (TarInfo, data) pairs, for hostile archives."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.GNU_FORMAT) as archive:
        for info, data in entries:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def entry(name, data=b"", kind=tarfile.REGTYPE, link=""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, (data if kind == tarfile.REGTYPE else None)


def assert_not_registered(worker, name):
    assert name not in worker.client.list()
    staged = list((worker.dir / "registry").glob(f"{name}@*"))
    assert staged == [], staged


def test_not_a_targz(worker):
    e = refused(worker, "junk", b"this is not an archive")
    assert (e.status, e.code) == (400, "invalid_archive")
    e = refused(worker, "truncated", targz({"f.py": "def f(e): return e\n" * 100})[:60])
    assert (e.status, e.code) == (400, "invalid_archive")
    assert_not_registered(worker, "junk")


def test_no_f_py(worker):
    e = refused(worker, "nofpy", targz({"main.py": "print(1)\n"}))
    assert (e.status, e.code) == (400, "missing_handler")
    assert_not_registered(worker, "nofpy")


def test_syntax_error_names_the_line(worker):
    e = refused(worker, "broken", targz({"f.py": "def f(event):\n    return (1,\n\nx = = 2\n"}))
    assert (e.status, e.code) == (400, "syntax_error")
    assert "f.py line" in e.message
    assert e.body["line"] >= 2
    assert_not_registered(worker, "broken")


def test_unsafe_paths(worker):
    cases = {
        "dotdot": tar_with([entry("f.py", b"def f(e): return e\n"), entry("../../escape.py", b"x")]),
        "absolute": tar_with([entry("f.py", b"def f(e): return e\n"), entry("/etc/cron.d/evil", b"x")]),
        "linkout": tar_with([entry("f.py", b"def f(e): return e\n"), entry("etc", kind=tarfile.SYMTYPE, link="../../../../etc")]),
        "abslink": tar_with([entry("f.py", b"def f(e): return e\n"), entry("passwd", kind=tarfile.SYMTYPE, link="/etc/passwd")]),
        "hardlink": tar_with([entry("f.py", b"def f(e): return e\n"), entry("shadow", kind=tarfile.LNKTYPE, link="/etc/shadow")]),
        "device": tar_with([entry("f.py", b"def f(e): return e\n"), entry("null", kind=tarfile.CHRTYPE)]),
    }
    for name, archive in cases.items():
        e = refused(worker, name, archive)
        assert (e.status, e.code) == (400, "unsafe_path"), (name, e)
        assert_not_registered(worker, name)
    assert not (worker.dir / "escape.py").exists() and not (worker.dir.parent / "escape.py").exists()


def test_links_inside_the_lambda_are_fine(worker):
    archive = tar_with([
        entry("f.py", b"from lib.alias import VALUE\ndef f(e): return VALUE\n"),
        entry("lib/__init__.py", b""),
        entry("lib/real.py", b"VALUE = 42\n"),
        entry("lib/alias.py", kind=tarfile.SYMTYPE, link="real.py"),
    ])
    worker.client.upload("linked", archive)
    assert worker.client.run("linked") == 42


def test_a_top_level_directory_is_accepted(worker):
    worker.client.upload("wrapped", targz({"wrapped/f.py": "def f(e):\n    return 'wrapped'\n"}))
    assert worker.client.run("wrapped") == "wrapped"


def test_unpacked_size_and_upload_size_limits(make_worker):
    w = make_worker(limits={"max_unpacked_mb": 1, "max_upload_mb": 1})
    bomb = targz({"f.py": "def f(e): return e\n", "padding.bin": b"\0" * (3 << 20)})
    assert len(bomb) < 100_000  # a small upload that would unpack big
    e = refused(w, "bomb", bomb)
    assert (e.status, e.code) == (413, "archive_too_large")
    import os
    e = refused(w, "huge", targz({"f.py": "def f(e): return e\n", "noise.bin": os.urandom(2 << 20)}))
    assert (e.status, e.code) == (413, "payload_too_large")
    assert_not_registered(w, "bomb")


def test_invalid_names(worker):
    for name in ("-leading", "has%20space", "a" * 65, "dots..ok"):
        archive = targz({"f.py": "def f(e): return e\n"})
        if name == "dots..ok":
            worker.client.upload(name, archive)  # dots are allowed inside a name
            continue
        e = refused(worker, name, archive)
        assert (e.status, e.code) == (400, "invalid_name"), name
