"""A part of a :mod:`sprout.elastic` matrix: the lambda run in each sandbox of a Matrix's
lease, holding tiles as ``.npy`` files in the lease's directory and computing on them.

An event is ``{"dir": "/leases/<id>", "ops": [op, ...], "blas_threads": 1}``; the reply is
``{"results": [one per op]}``. A tile is named by a reference ``{"name": "m3_0_1", "shape":
[rows, cols], "make": recipe or null}``; a tile not yet in the directory is made from its
recipe (``{"fill": x}``, ``{"random": [seed, i, j]}``) by the first op that reads it, and
kept there (allocated on first touch). Tiles are read with ``mmap``: a tile another part
wrote is read from the page cache, never copied through the worker. The ops:

- ``{"op": "matmul", "out": name, "a": [refs], "b": [refs]}``: ``sum(a[k] @ b[k])``, kept;
- ``{"op": "binary", "out": name, "fn": "add"|"sub"|"mul"|"div", "a": ref or number, "b": ...}``;
- ``{"op": "touch", "a": ref}``: make the tile if it is not there;
- ``{"op": "sum", "a": ref}``: the tile's sum (a float);
- ``{"op": "delete", "names": [names]}``: remove tiles (those not there are skipped).

Writes go to a temporary file renamed into place, so a reader never sees half a tile, and
two parts making the same tile from its recipe at once both make the same bytes.
"""

import contextlib
import ctypes
import os
import re
import tempfile

import numpy as np

NAME = re.compile(r"[A-Za-z0-9_]{1,100}")
BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide}
_blas = {"threads": None}


def _set_blas_threads(n):
    """Ask the OpenBLAS NumPy loaded for ``n`` threads (the parts are the parallelism; a
    part's BLAS threads would only share its CPU). Skipped when it is not found."""
    if _blas["threads"] == n:
        return
    _blas["threads"] = n
    from numpy._core import _multiarray_umath

    lib = ctypes.CDLL(_multiarray_umath.__file__)  # dlsym searches the BLAS it links, too
    for symbol in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "openblas_set_num_threads"):
        setter = getattr(lib, symbol, None)
        if setter is not None:
            setter(ctypes.c_int(n))
            return


def _path(directory, name):
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"a tile's name is 1 to 100 letters, digits and '_', not {name!r}")
    return os.path.join(directory, name + ".npy")


def _made(shape, make):
    if "fill" in make:
        return np.full(shape, float(make["fill"]))
    if "random" in make:
        return np.random.default_rng([int(x) for x in make["random"]]).random(tuple(shape))
    raise ValueError(f"unknown tile recipe {make!r}")


def _save(directory, name, tile):
    path = _path(directory, name)
    # A name no other writer has: every part's helper is PID 1 of its own namespace.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f"{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, np.ascontiguousarray(tile, dtype=np.float64))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _load(directory, ref):
    """The tile ``ref`` names, made from its recipe when it is not there yet."""
    if not isinstance(ref, dict):
        return ref  # a number, for a binary op
    path = _path(directory, ref["name"])
    try:
        return np.load(path, mmap_mode="r")
    except FileNotFoundError:
        if not ref.get("make"):
            raise LookupError(f"tile {ref['name']} is not in the lease's directory (its matrix released?)") from None
    tile = _made(ref["shape"], ref["make"])
    _save(directory, ref["name"], tile)
    return tile


def _matmul(directory, op):
    acc = None
    for a_ref, b_ref in zip(op["a"], op["b"], strict=True):
        a, b = _load(directory, a_ref), _load(directory, b_ref)
        if acc is None:
            acc = a @ b
        else:
            acc += a @ b
    _save(directory, op["out"], acc)


def _run(directory, op):
    kind = op.get("op")
    if kind == "matmul":
        return _matmul(directory, op)
    if kind == "binary":
        fn = BINARY[op["fn"]]
        return _save(directory, op["out"], fn(_load(directory, op["a"]), _load(directory, op["b"])))
    if kind == "touch":
        _load(directory, op["a"])
        return None
    if kind == "sum":
        return float(np.sum(_load(directory, op["a"])))
    if kind == "delete":
        for name in op["names"]:
            try:
                os.unlink(_path(directory, name))
            except FileNotFoundError:
                pass
        return None
    raise ValueError(f"unknown op {kind!r}")


def f(event):
    directory = event["dir"]
    if not isinstance(directory, str) or not re.fullmatch(r"/leases/[0-9a-f]{32}", directory):
        raise ValueError(f"dir must be a lease's directory /leases/<id>, not {directory!r}")
    _set_blas_threads(int(event.get("blas_threads", 1)))
    return {"results": [_run(directory, op) for op in event["ops"]]}
