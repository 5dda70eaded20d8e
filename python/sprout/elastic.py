"""Matrices whose tiles live in sandboxes (EbbRT's Sage matrix): ``sprout.elastic.Matrix``.

    from sprout.elastic import Context

    with Context(parts=2, client=url) as ctx:      # a lease of 2 sandboxes, made when needed
        a = ctx.random((4096, 4096), seed=1)       # no tile exists yet
        b = ctx.from_numpy(array)                  # tiles uploaded to the lease's directory
        c = a @ b + 1.0                            # tiles made on first touch, computed in parts
        print(c.sum(), c.to_numpy()[0, :4])

A :class:`Context` holds a lease (:class:`sprout.Lease`) of ``parts`` sandboxes of the
elastic lambda (``sprout.elastic_parts``, with the caller's NumPy pinned), taken when an
operation first needs it. A :class:`Matrix` is a grid of square tiles (``tile`` rows and
columns, float64), each a ``.npy`` file in the lease's directory (``/leases/<id>``, shared by
its parts), owned by one part: tile ``(i, j)`` of a matrix is computed by part ``(i * columns
+ j) % parts``, which reads the tiles it needs from the others' files by ``mmap`` (no copy
through the worker or the client). Operations run at once, each part's share in one call,
the parts in parallel. A matrix's tiles are deleted when it is collected (in the
background) or by :meth:`Matrix.release`; the lease goes when the context is released, collected, or idle
past ``idle_timeout``. A part whose sandbox died loses nothing (the tiles are files): its
work goes to the parts left. See docs/offload.md.
"""

import io
import itertools
import threading
import urllib.parse
import weakref
from concurrent.futures import ThreadPoolExecutor

from sprout.client import Client, SproutError, as_client

DEFAULT_TILE = 1024
UPLOADS_IN_FLIGHT = 4


def _numpy():
    import numpy

    return numpy


def parts_package():
    """The elastic lambda: ``sprout.elastic_parts`` with the caller's NumPy version pinned."""
    from sprout import ship

    files = {"f.py": b"from sprout.elastic_parts import f  # noqa: F401\n",
             "requirements.txt": f"numpy=={_numpy().__version__}\n".encode()}
    return ship.Package(ship.lambda_name("elastic", files), files)


class Context:
    """The sandboxes a family of matrices lives in (operations mix matrices of one context
    only). ``parts``: how many sandboxes (at most the worker's ``max_per_lambda``); ``tile``:
    the tiles' edge; ``client``: a :class:`sprout.Client` or a URL (by default
    ``Client($SPROUT_URL)``), with the worker's token; ``blas_threads``: BLAS threads in each
    part (1: the parts are the parallelism)."""

    def __init__(self, parts=2, *, client=None, tile=DEFAULT_TILE, idle_timeout=60, blas_threads=1):
        if not isinstance(parts, int) or isinstance(parts, bool) or parts < 1:
            raise ValueError(f"parts must be a positive int, not {parts!r}")
        if not isinstance(tile, int) or isinstance(tile, bool) or tile < 1:
            raise ValueError(f"tile must be a positive int, not {tile!r}")
        self.parts, self.tile, self.idle_timeout, self.blas_threads = parts, tile, idle_timeout, blas_threads
        self.client = as_client(client)
        self._lease = None
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._lost = set()

    # ------------------------------------------------------------ the lease

    @property
    def lease(self):
        """The lease, taken on first use."""
        with self._lock:
            if self._lease is None:
                from sprout import ship
                from sprout.lease import Lease

                name = ship.deploy_package(parts_package(), self.client)
                self._lease = Lease(name, self.parts, client=self.client, idle_timeout=self.idle_timeout)
                self._dir = self._lease.dir
            return self._lease

    def release(self):
        """Give the sandboxes back: every matrix of this context is gone with them."""
        with self._lock:
            if self._lease is not None:
                self._lease.release()

    @property
    def released(self):
        return self._lease is not None and self._lease.released

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        state = "no lease yet" if self._lease is None else repr(self._lease)
        return f"<sprout.elastic.Context: {self.parts} parts, tile {self.tile}, {state}>"

    # ------------------------------------------------------------ running ops

    def run(self, ops_by_part):
        """Run ``{part: [op, ...]}``, each part's ops in one call, the parts in parallel;
        returns ``{part: [result, ...]}``. A part found lost (``lease_part_lost``) hands its
        ops to the next part alive."""
        lease = self.lease
        pending = {p: ops for p, ops in ops_by_part.items() if ops}
        results = {}
        while pending:
            with ThreadPoolExecutor(max_workers=len(pending)) as pool:
                calls = {p: pool.submit(self._call, lease, p, ops) for p, ops in pending.items()}
            moved = {}
            for p, call in calls.items():
                try:
                    results[p] = call.result()
                except SproutError as e:
                    if e.code != "lease_part_lost":
                        raise
                    self._lost.add(p)
                    moved.setdefault(self._alive(p), []).extend(pending[p])
            pending = moved
        return results

    def _call(self, lease, part, ops):
        return lease.call(part, {"dir": self._dir, "ops": ops, "blas_threads": self.blas_threads})["results"]

    def _alive(self, part):
        for p in itertools.chain(range(part + 1, self.parts), range(part + 1)):
            if p not in self._lost:
                return p
        raise SproutError(502, "lease_part_lost", f"every part of lease {self._lease.id} lost its sandbox")

    def owner(self, index):
        """The part that owns tile number ``index`` (row-major) of a matrix."""
        p = index % self.parts
        return p if p not in self._lost else self._alive(p)

    def _file(self, method, name, body=None):
        from sprout.lease import _send

        path = f"/leases/{self.lease.id}/files/{urllib.parse.quote(name + '.npy', safe='')}"
        return Client._check(_send(self.client, method, path, body)).body

    def _new_name(self):
        return f"m{next(self._ids)}"

    # ------------------------------------------------------------ matrices

    def zeros(self, shape):
        """A matrix of zeros; its tiles are made when first touched."""
        return self.full(shape, 0.0)

    def ones(self, shape):
        return self.full(shape, 1.0)

    def full(self, shape, value):
        value = float(value)
        return Matrix(self, shape, lambda i, j: {"fill": value})

    def random(self, shape, seed=0):
        """Uniform [0, 1) floats; tile ``(i, j)`` from ``numpy.random.default_rng([seed, i, j])``
        (the same numbers for the same seed and tile), made when first touched."""
        seed = int(seed)
        return Matrix(self, shape, lambda i, j: {"random": [seed, i, j]})

    def from_numpy(self, array):
        """A matrix holding ``array`` (2-D, taken as float64), its tiles uploaded now."""
        np = _numpy()
        array = np.asarray(array, dtype=np.float64)
        if array.ndim != 2:
            raise ValueError(f"a Matrix is 2-D, not {array.ndim}-D")
        matrix = Matrix(self, array.shape)
        t = self.tile

        def put(ij):
            i, j = ij
            raw = io.BytesIO()
            np.save(raw, np.ascontiguousarray(array[i * t:(i + 1) * t, j * t:(j + 1) * t]))
            self._file("PUT", matrix._names[ij], raw.getvalue())

        with ThreadPoolExecutor(max_workers=UPLOADS_IN_FLIGHT) as pool:
            list(pool.map(put, matrix._names))
        return matrix


def _delete(context, by_part):
    """Delete a matrix's tiles from their parts (never raises: at collection or exit there is
    no one to tell)."""
    if context._lease is None or context.released:
        return
    try:
        context.run({p: [{"op": "delete", "names": names}] for p, names in by_part.items()})
    except Exception:  # noqa: BLE001
        pass


def _delete_later(context, by_part):
    """A matrix's finalizer: its tiles deleted on a thread of their own, not in the garbage
    collector's (which may run while this thread holds a lock the requests need)."""
    try:
        threading.Thread(target=_delete, args=(context, by_part), daemon=True, name="sprout-elastic-delete").start()
    except RuntimeError:  # the interpreter is exiting: the lease goes, and its directory with it
        pass


class Matrix:
    """A 2-D float64 matrix whose tiles live in a :class:`Context`'s sandboxes. Made by the
    context (``zeros``, ``ones``, ``full``, ``random``, ``from_numpy``) or by operations:
    ``a @ b``; ``a + b``, ``a - b``, ``a * b``, ``a / b`` element-wise with a matrix of the
    same shape or a number (either side), ``-a``; ``a.sum()``; ``a.to_numpy()``."""

    def __init__(self, context, shape, recipe=None):
        rows, cols = (int(n) for n in shape)
        if rows < 1 or cols < 1:
            raise ValueError(f"a Matrix's shape is two positive ints, not {shape!r}")
        self.context, self.shape = context, (rows, cols)
        t = context.tile
        self.grid = (-(-rows // t), -(-cols // t))
        prefix = context._new_name()
        self._names = {(i, j): f"{prefix}_{i}_{j}" for i in range(self.grid[0]) for j in range(self.grid[1])}
        self._recipe = recipe
        by_part = {}
        for ij, name in self._names.items():
            by_part.setdefault(self._owner(ij), []).append(name)
        self._finalizer = weakref.finalize(self, _delete_later, context, by_part)

    def _owner(self, ij):
        return self.context.owner(ij[0] * self.grid[1] + ij[1])

    def _tile_shape(self, ij):
        t = self.context.tile
        return [min(t, self.shape[0] - ij[0] * t), min(t, self.shape[1] - ij[1] * t)]

    def ref(self, ij):
        """The reference a part reads tile ``ij`` by (with its recipe, if it has one)."""
        make = self._recipe(*ij) if self._recipe else None
        return {"name": self._names[ij], "shape": self._tile_shape(ij), "make": make}

    @property
    def dtype(self):
        return _numpy().dtype("float64")

    def _check_live(self):
        if not self._finalizer.alive:
            raise ValueError("this Matrix was released")
        if self.context.released:
            raise ValueError("this Matrix's context was released")

    def _apply(self, out, make_op):
        """Run ``make_op(ij)`` for each of ``out``'s tiles on the part that owns it."""
        by_part = {}
        for ij in out._names:
            by_part.setdefault(out._owner(ij), []).append(make_op(ij))
        self.context.run(by_part)
        return out

    # ------------------------------------------------------------ operations

    def __matmul__(self, other):
        if not isinstance(other, Matrix):
            return NotImplemented
        self._same_context(other)
        if self.shape[1] != other.shape[0]:
            raise ValueError(f"matmul: shapes {self.shape} and {other.shape} do not align")
        out = Matrix(self.context, (self.shape[0], other.shape[1]))
        inner = range(self.grid[1])
        return self._apply(out, lambda ij: {"op": "matmul", "out": out._names[ij],
                                            "a": [self.ref((ij[0], k)) for k in inner],
                                            "b": [other.ref((k, ij[1])) for k in inner]})

    def _binary(self, fn, other, swapped=False):
        if isinstance(other, Matrix):
            self._same_context(other)
            if other.shape != self.shape:
                raise ValueError(f"{fn}: shapes {self.shape} and {other.shape} differ")
            other_ref = other.ref
        elif isinstance(other, (int, float)) and not isinstance(other, bool):
            value = float(other)
            other_ref = lambda ij: value  # noqa: E731
        else:
            return NotImplemented
        self._check_live()
        out = Matrix(self.context, self.shape)

        def op(ij):
            a, b = self.ref(ij), other_ref(ij)
            return {"op": "binary", "fn": fn, "out": out._names[ij], "a": b if swapped else a, "b": a if swapped else b}

        return self._apply(out, op)

    def __add__(self, other):
        return self._binary("add", other)

    def __radd__(self, other):
        return self._binary("add", other, swapped=True)

    def __sub__(self, other):
        return self._binary("sub", other)

    def __rsub__(self, other):
        return self._binary("sub", other, swapped=True)

    def __mul__(self, other):
        return self._binary("mul", other)

    def __rmul__(self, other):
        return self._binary("mul", other, swapped=True)

    def __truediv__(self, other):
        return self._binary("div", other)

    def __rtruediv__(self, other):
        return self._binary("div", other, swapped=True)

    def __neg__(self):
        return self._binary("mul", -1.0)

    def sum(self):
        """The sum of every element (each part sums its tiles)."""
        self._check_live()
        by_part = {}
        for ij in self._names:
            by_part.setdefault(self._owner(ij), []).append({"op": "sum", "a": self.ref(ij)})
        return float(sum(sum(results) for results in self.context.run(by_part).values()))

    def touch(self):
        """Make every tile not made yet (allocation, without waiting for an operation)."""
        self._check_live()
        by_part = {}
        for ij in self._names:
            by_part.setdefault(self._owner(ij), []).append({"op": "touch", "a": self.ref(ij)})
        self.context.run(by_part)
        return self

    def to_numpy(self):
        """The matrix as a NumPy array, its tiles read from the lease's directory."""
        np = _numpy()
        if self._recipe:
            self.touch()
        self._check_live()
        out = np.empty(self.shape)
        t = self.context.tile

        def get(ij):
            i, j = ij
            out[i * t:(i + 1) * t, j * t:(j + 1) * t] = np.load(io.BytesIO(self.context._file("GET", self._names[ij])))

        with ThreadPoolExecutor(max_workers=UPLOADS_IN_FLIGHT) as pool:
            list(pool.map(get, self._names))
        return out

    def __array__(self, dtype=None, copy=None):
        array = self.to_numpy()
        return array if dtype is None else array.astype(dtype)

    def release(self):
        """Delete the tiles now (when the matrix is collected, they are deleted in the
        background). Idempotent."""
        detached = self._finalizer.detach()
        if detached:
            _delete(*detached[2])

    def _same_context(self, other):
        if other.context is not self.context:
            raise ValueError("matrices of different contexts cannot be combined (their tiles are in different leases)")
        self._check_live()
        other._check_live()

    def __repr__(self):
        return (f"<sprout.elastic.Matrix {self.shape[0]}x{self.shape[1]} float64, {self.grid[0]}x{self.grid[1]} tiles "
                f"over {self.context.parts} parts>")
