"""`sprout.elastic.Matrix` (python/sprout/elastic.py, elastic_parts.py) over a real worker:
tiles in a lease's shared directory (crates/worker/src/lease_files.rs), made on first touch,
computed in the lease's sandboxes, compared with NumPy's results; deleted on collection,
gone with the lease; the files routes' checks."""

import gc
import json
import os
import signal
import time
import urllib.error

import numpy as np
import pytest

from conftest import api_request
from sprout import SproutError
from sprout.elastic import Context

TILE = 128


@pytest.fixture(scope="module")
def ctx(worker):
    with Context(parts=2, client=worker.client, tile=TILE) as context:
        yield context


def lease_dir(worker, context):
    return worker.dir / "leases" / context.lease.id


def tiles_in(worker, context):
    return sorted(p.name for p in lease_dir(worker, context).iterdir() if p.suffix == ".npy")


def local_random(shape, seed, tile=TILE):
    """What ctx.random(shape, seed) holds, made here tile by tile as the parts make it."""
    out = np.empty(shape)
    for i in range(-(-shape[0] // tile)):
        for j in range(-(-shape[1] // tile)):
            block = out[i * tile:(i + 1) * tile, j * tile:(j + 1) * tile]
            block[...] = np.random.default_rng([seed, i, j]).random(block.shape)
    return out


def test_a_matrix_computes_as_numpy_does(ctx):
    a_np = np.random.default_rng(7).normal(size=(300, 200))  # edges not a multiple of the tile
    a = ctx.from_numpy(a_np)
    b = ctx.random((200, 260), seed=3)
    b_np = local_random((200, 260), 3)
    c = a @ b
    assert c.shape == (300, 260) and c.grid == (3, 3)
    np.testing.assert_allclose(c.to_numpy(), a_np @ b_np, rtol=1e-9, atol=1e-10)
    expr = (1.0 - c) * 2 + c / 4.0 - (-c)
    c_np = a_np @ b_np
    np.testing.assert_allclose(expr.to_numpy(), (1.0 - c_np) * 2 + c_np / 4.0 + c_np, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose((c * c).sum(), (c_np * c_np).sum(), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(np.asarray(2 / (a * a + 1)), 2 / (a_np * a_np + 1), rtol=1e-9, atol=1e-10)
    np.testing.assert_array_equal(ctx.ones((5, 3)).to_numpy(), np.ones((5, 3)))


def test_parts_making_one_tile_at_once_do_not_collide(tmp_path):
    # Every part's helper is PID 1 of its namespace: writers sharing a PID share nothing else.
    from concurrent.futures import ThreadPoolExecutor

    from sprout import elastic_parts
    ref = {"name": "m1_0_0", "shape": [64, 64], "make": {"random": [3, 0, 0]}}
    op = {"op": "binary", "out": "m2_0_0", "fn": "add", "a": ref, "b": 1.0}

    def make(_):
        elastic_parts._save(str(tmp_path), ref["name"], elastic_parts._made(ref["shape"], ref["make"]))
        elastic_parts._run(str(tmp_path), op)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(make, range(200)))
    expected = np.random.default_rng([3, 0, 0]).random((64, 64))
    np.testing.assert_array_equal(np.load(tmp_path / "m1_0_0.npy"), expected)
    np.testing.assert_array_equal(np.load(tmp_path / "m2_0_0.npy"), expected + 1.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m1_0_0.npy", "m2_0_0.npy"]


def test_tiles_are_made_on_first_touch_and_deleted_on_collection(worker, ctx):
    z = ctx.zeros((2 * TILE, 2 * TILE))
    x = ctx.from_numpy(np.arange(4.0).reshape(2, 2))
    prefix_z, prefix_x = z._names[0, 0].rpartition("_0_0")[0], x._names[0, 0].rpartition("_0_0")[0]
    assert [t for t in tiles_in(worker, ctx) if t.startswith(prefix_z + "_")] == [], "zeros made nothing yet"
    assert [t for t in tiles_in(worker, ctx) if t.startswith(prefix_x + "_")] == [f"{prefix_x}_0_0.npy"]
    assert z.sum() == 0.0
    assert len([t for t in tiles_in(worker, ctx) if t.startswith(prefix_z + "_")]) == 4, "the sum touched them all"
    y = z + 1.0
    prefix_y = y._names[0, 0].rpartition("_0_0")[0]
    assert len([t for t in tiles_in(worker, ctx) if t.startswith(prefix_y + "_")]) == 4
    del y, z
    gc.collect()  # their tiles are deleted in the background
    deadline = time.time() + 10
    while [t for t in tiles_in(worker, ctx) if t.startswith((prefix_y + "_", prefix_z + "_"))]:
        assert time.time() < deadline, f"collected matrices' tiles are still there: {tiles_in(worker, ctx)}"
        time.sleep(0.05)
    x.release()
    assert not [t for t in tiles_in(worker, ctx) if t.startswith(prefix_x + "_")]
    with pytest.raises(ValueError, match="released"):
        x + 1.0


def test_mixing_contexts_or_shapes_is_refused(worker, ctx):
    other = Context(parts=1, client=worker.client, tile=TILE)
    with pytest.raises(ValueError, match="different contexts"):
        ctx.zeros((2, 2)) + other.zeros((2, 2))
    with pytest.raises(ValueError, match="do not align"):
        ctx.zeros((2, 3)) @ ctx.zeros((2, 3))
    with pytest.raises(ValueError, match="differ"):
        ctx.zeros((2, 3)) + ctx.zeros((3, 2))
    with pytest.raises(TypeError):
        ctx.zeros((2, 2)) + "x"
    with pytest.raises(ValueError, match="2-D"):
        ctx.from_numpy(np.zeros(3))
    assert other._lease is None, "nothing ran, so no lease was taken"


def test_the_lease_directory_goes_with_the_context(worker):
    context = Context(parts=2, client=worker.client, tile=TILE)
    m = context.random((TILE, TILE), seed=1).touch()
    directory = lease_dir(worker, context)
    assert directory.is_dir() and oct(directory.stat().st_mode & 0o777) == "0o700"
    assert directory.stat().st_uid == 65534, "the sandboxes' user owns it"
    assert oct(directory.parent.stat().st_mode & 0o777) == "0o711", "lease ids cannot be listed from a sandbox"
    context.release()
    assert not directory.exists()
    assert context.lease.id not in [entry["lease"] for entry in worker.client._check(
        worker.client._call("GET", "/leases")).json()]
    with pytest.raises(ValueError, match="context was released"):
        m.sum()


def test_lease_files_are_read_and_written_by_name_only(worker, ctx):
    base = f"/leases/{ctx.lease.id}/files"
    assert api_request(worker, "PUT", f"{base}/raw.bin", b"\x00\x01" * 1000)[0] == 200
    assert api_request(worker, "GET", f"{base}/raw.bin") == (200, b"\x00\x01" * 1000)
    assert (lease_dir(worker, ctx) / "raw.bin").stat().st_uid == 65534
    status, body = api_request(worker, "GET", f"{base}/missing.bin")
    assert (status, json.loads(body)["error"]) == (404, "not_found")
    for bad in (".hidden", "a%2Fb", "..", "a%20b"):
        status, body = api_request(worker, "PUT", f"{base}/{bad}", b"x")
        assert status in (400, 404), (bad, status)
        if status == 400:
            assert json.loads(body)["error"] == "invalid_request"
    status, body = api_request(worker, "GET", f"/leases/{'0' * 32}/files/x.npy")
    assert (status, json.loads(body)["error"]) == (404, "lease_not_found")
    assert api_request(worker, "GET", f"{base}/raw.bin", token=False)[0] == 401
    # A link a part leaves there is never followed by the worker.
    (lease_dir(worker, ctx) / "passwd").symlink_to("/etc/passwd")
    status, body = api_request(worker, "GET", f"{base}/passwd")
    assert status != 200 and b"root:" not in body
    limit = 50 << 20
    try:
        status, body = api_request(worker, "PUT", f"{base}/big.bin", b"\x00" * (limit + 1))
        assert (status, json.loads(body)["error"]) == (413, "payload_too_large")
    except urllib.error.URLError as e:  # closed on the rest of the body
        assert isinstance(e.reason, (BrokenPipeError, ConnectionResetError)), e
    assert not (lease_dir(worker, ctx) / "big.bin").exists()


def test_an_op_a_part_refuses_is_reported_not_swallowed(ctx):
    with pytest.raises(SproutError) as failed:
        ctx.run({0: [{"op": "sum", "a": {"name": "nope", "shape": [1, 1], "make": None}}]})
    assert failed.value.code == "handler_exception"
    assert "not in the lease's directory" in failed.value.message + str(failed.value.body)


def sandbox_pids(worker):
    """The worker's sandboxes' processes (in their sb-N cgroups; not Zygotes, not spares)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cgroups = open(f"/proc/{entry}/cgroup").read().splitlines()
            except OSError:
                continue
            for line in cgroups:
                _, controllers, path = line.split(":", 2)
                if "memory" in controllers.split(",") and f"sprout-t{worker.port}/" in path \
                        and path.rpartition("/")[2].startswith("sb-"):
                    found.append(int(entry))
    return found


def test_a_part_that_died_loses_no_tile_and_its_work_moves(make_worker):
    worker = make_worker()
    with Context(parts=2, client=worker.client, tile=TILE) as context:
        a_np = np.random.default_rng(5).random((2 * TILE, 2 * TILE))
        a = context.from_numpy(a_np)
        np.testing.assert_allclose((a + 1.0).sum(), (a_np + 1.0).sum())
        parts = sandbox_pids(worker)
        assert len(parts) == 2, parts
        os.kill(parts[0], signal.SIGKILL)
        c = a @ a  # a part finds its sandbox gone: its tiles are files, its work goes to the other
        np.testing.assert_allclose(c.to_numpy(), a_np @ a_np, rtol=1e-9, atol=1e-10)
        assert len(context._lost) == 1
