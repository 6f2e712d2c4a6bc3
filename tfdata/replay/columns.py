"""Column operations of a replay buffer: views of one field, statistics, running statistics.

What a buffer offers through this module (methods of :class:`tfdata.replay.core.ReplayCore`):

``column(name)``
    A :class:`Column`: read-only views of one field over the rows held, oldest to newest
    (ring order), one or two segments, no copy.
``column_stats(name)``
    A :class:`FieldStats` of one field over the rows held, computed from scratch by one compiled
    pass (:func:`tfdata.kernels._columns.column_scan_ranges` over ``[[0, rows]]``).
``stats(name)``
    The running statistics of a field named in ``stats=`` at construction (:class:`RunningStats`).
``update_field(name, indices, values)``
    Relabelling (validation lives in the core, the statistics are told here).

Running statistics
------------------
:class:`RunningStats` keeps, per field, a tree of statistics over blocks of rows (see
:mod:`tfdata.kernels._columns`): each leaf the count, mean, sum of squared deviations, min and
max of the live rows of one block, each node the exact merge of its children. Statistics of
the live rows are the root. Nothing is ever removed from a running sum: a block whose rows
changed is recomputed from its rows, so overwritten rows leave the statistics exactly, min and
max stay exact, and no rounding error accumulates (the tree always equals a fresh build from
the rows held, bit for bit, which is what a loaded state is checked against).

The work is done when the statistics are read, not when rows are written. A write hook that
hears only laps of the ring (``wraps_only``: the generated push and extend call it when a
write fills the last slot, nothing else) lets the statistics know which slots were written
since they were last read: ``laps * capacity + cursor`` moved from its value then. A read
recomputes the blocks those slots fall in (at most every block) and their ancestors, then the
root is the answer: the cost of a read is proportional to the rows written since the previous
read, and a push or an extend costs what it costs without statistics (plus a branch at the end
of the ring). :meth:`RunningStats.mark` flags the blocks of relabelled rows the same way.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from ..errors import SpecError


class FieldStats:
    """Statistics of one field over a set of rows, per element, as float64 (read-only).

    Attributes
    ----------
    name : str
    count : int
        Rows counted.
    mean, var, std, min, max : ndarray of float64, shape ``field.shape``
        Per element (0-d arrays for a scalar field). ``var`` is the population variance
        (``ddof=0``, numpy's default: the mean squared deviation from ``mean``), ``std`` its
        square root. Integers and bools are counted as float64 values (bool: 0 and 1; integers
        beyond 2**53 are rounded). A NaN value makes its element's statistics NaN; +inf / -inf
        make the mean infinite (NaN with both) and the variance NaN, as numpy's functions
        would. With ``count == 0`` every statistic is NaN. The arrays are read-only views of
        one array of shape ``(5, *field.shape)``, :attr:`values`.
    """

    __slots__ = ("name", "count", "values")

    def __init__(self, name: str, count: int, out: np.ndarray, shape: tuple):
        # a copy (the kernel's array is reused), read-only; attributes are views of it
        values = out[:5].copy().reshape((5,) + tuple(shape))
        values.flags.writeable = False
        setattr_ = object.__setattr__
        setattr_(self, "name", name)
        setattr_(self, "count", int(count))
        setattr_(self, "values", values)

    def __setattr__(self, attr, value):
        raise AttributeError("FieldStats is read-only")

    @property
    def mean(self) -> np.ndarray:
        return self.values[0, ...]

    @property
    def var(self) -> np.ndarray:
        return self.values[1, ...]

    @property
    def std(self) -> np.ndarray:
        return self.values[2, ...]

    @property
    def min(self) -> np.ndarray:
        return self.values[3, ...]

    @property
    def max(self) -> np.ndarray:
        return self.values[4, ...]

    def normalize(self, x, eps: float = 1e-8, clip: float | None = None) -> np.ndarray:
        """``(x - mean) / sqrt(var + eps)``, optionally clipped to ``[-clip, clip]``.

        The sample transform :class:`tfdata.transforms.Normalize` multiplies by
        ``1 / sqrt(var + eps)`` instead: in float32, the same values but for one within an ulp
        of float64 of a float32 rounding boundary.

        Parameters
        ----------
        x : array_like, shape ``(..., *field.shape)``
            Values of this field (one row or a batch).
        eps : float, default 1e-8
            Added to the variance (an element that never varies is divided by ``sqrt(eps)``).
        clip : float, optional

        Returns
        -------
        ndarray
            Of ``x``'s float dtype (float16/32/64), else float64; a new array.

        Raises
        ------
        ValueError
            The statistics count no row (nothing to normalise by).
        """
        if self.count == 0:
            raise ValueError(f"statistics of field {self.name!r} count no row: nothing to normalise by")
        x = np.asarray(x)
        out = (x - self.mean) / np.sqrt(self.var + float(eps))
        if clip is not None:
            np.clip(out, -float(clip), float(clip), out=out)
        dtype = x.dtype if x.dtype.kind == "f" else np.float64
        return out.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return (f"FieldStats({self.name!r}, count={self.count}, mean={self.mean.tolist()}, "
                f"std={self.std.tolist()}, min={self.min.tolist()}, max={self.max.tolist()})")


def merge_stats(name: str, shape: tuple, parts) -> FieldStats:
    """The statistics of the union of disjoint row sets, from theirs: ``parts`` is a sequence of
    ``(count, values)`` (``values``: float64 ``(5, *shape)`` as :attr:`FieldStats.values`).

    Chan et al.'s merge, in the order given, in float64 (``M2 = var * count``); a non-finite
    mean merges as a weighted mean and makes the variance NaN; min and max are NaN-sticky, as
    the kernels' merges are. One non-empty part is returned as it is."""
    k = int(np.prod(shape, dtype=np.int64))
    live = [(int(c), np.asarray(v, np.float64).reshape(5, k)) for c, v in parts if int(c) > 0]
    if len(live) <= 1:
        c, v = live[0] if live else (0, np.full((5, k), np.nan))
        return FieldStats(name, c, v, shape)
    n, v0 = live[0]
    mean, m2, mn, mx = v0[0].copy(), v0[1] * n, v0[3].copy(), v0[4].copy()
    for nb, v in live[1:]:
        tot = n + nb
        mb = v[0]
        d = mb - mean
        finite = np.isfinite(mean) & np.isfinite(mb)
        with np.errstate(invalid="ignore", over="ignore"):
            m2 = np.where(finite, m2 + v[1] * nb + d * d * (n * (nb / tot)), np.nan)
            mean = np.where(finite, mean + d * (nb / tot), mean * (n / tot) + mb * (nb / tot))
        mn = np.minimum(mn, v[3])  # NaN-sticky
        mx = np.maximum(mx, v[4])
        n = tot
    var = m2 / n
    with np.errstate(invalid="ignore"):
        std = np.sqrt(var)
    return FieldStats(name, n, np.stack([mean, var, std, mn, mx]), shape)


class Column:
    """Read-only views of one field over the rows a buffer held when it was made, oldest first.

    The views are of the buffer's live memory, not copies: rows written (or relabelled) later
    change them, and once the buffer laps them they show other rows. Take them, use them, and
    copy what must be kept (``np.array(column)``) before writing more.

    Attributes
    ----------
    name : str
    segments : tuple of ndarray
        One view (the ring has not wrapped, or the oldest row is in slot 0), two (slots
        ``cursor..capacity`` then ``0..cursor``) or none (an empty buffer), each; a
        :class:`~tfdata.SharedReplayBuffer`'s are those of each shard in turn, each
        ``(rows, *field.shape)`` of the field's
        dtype, read-only; together ``len(column)`` rows in ring order (oldest to newest). Views
        of a field inside records (AoS) are strided.
    dtype : numpy.dtype
    shape : tuple
        ``(len(column), *field.shape)``.
    """

    __slots__ = ("name", "segments", "dtype", "shape")

    def __init__(self, name: str, segments: tuple, field):
        views = []
        for s in segments:
            v = s.view()
            v.flags.writeable = False
            views.append(v)
        self.name = name
        self.segments = tuple(views)
        self.dtype = field.dtype
        self.shape = (sum(v.shape[0] for v in views),) + field.shape

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype=None, copy=None):
        """The rows in ring order as one new array (a copy: two segments cannot be one view).
        ``copy=False`` is refused unless there is at most one segment, which is then returned
        as it is (read-only)."""
        if copy is False:
            if len(self.segments) > 1:
                raise ValueError(f"column {self.name!r}: two segments cannot be one array without "
                                 f"a copy")
            one = self.segments[0] if self.segments else np.empty(self.shape, self.dtype)
            return one if dtype is None else one.astype(dtype, copy=False)
        if not self.segments:
            out = np.empty(self.shape, self.dtype)
        else:
            out = np.concatenate(self.segments)
        return out if dtype is None else out.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return (f"Column({self.name!r}, rows={len(self)}, dtype={self.dtype}, "
                f"segments={len(self.segments)})")


def check_stats_fields(spec, stored, names, next_of: dict, elide: bool) -> tuple:
    """``names`` (an iterable of field names, or None) as a tuple of distinct fields whose
    statistics can be kept: stored (not an elided next field) and of a bool, integer or float
    dtype. Raises SpecError naming the field otherwise, TypeError for a bare string."""
    if names is None:
        return ()
    if isinstance(names, (str, bytes)):
        raise TypeError(f"stats must be a list of field names, got the string {names!r} "
                        f"(write stats=[{names!r}])")
    try:
        names = list(names)
    except TypeError:
        raise TypeError(f"stats must be a list of field names, got {type(names).__name__}") from None
    out = []
    for name in names:
        if not isinstance(name, str) or name not in spec:
            raise SpecError(f"stats: {spec.unknown_message(name)}")
        if name in out:
            raise SpecError(f"stats: field {name!r} is named twice")
        if name not in stored:
            raise SpecError(f"stats: field {name!r} is not stored (it is read from the next row's "
                            f"{next_of.get(name)!r}: elide_next=True, or frame_stack of "
                            f"{next_of.get(name)!r}); keep the statistics of "
                            f"{next_of.get(name)!r} instead")
        f = spec[name]
        if f.dtype.kind not in "biuf":
            raise SpecError(f"stats: field {name!r} has dtype {f.dtype}; statistics are kept for "
                            f"bool, integer and float fields only")
        out.append(name)
    return tuple(out)


def stats_nbytes(spec, names, capacity: int) -> int:
    """Bytes :class:`RunningStats` holds for ``names`` of ``spec`` and ``capacity`` slots."""
    from ..kernels._columns import tree_nbytes

    return int(sum(tree_nbytes(capacity, _elems(spec[n]), spec[n].dtype.itemsize) for n in names))


def _elems(field) -> int:
    return int(math.prod(field.shape))


class _Tree:
    """One field's statistics tree (arrays as :mod:`tfdata.kernels._columns` describes them)."""

    def __init__(self, field, capacity: int, allocator):
        from ..kernels import _columns as kc

        self.kc = kc
        self.field = field
        self.k = _elems(field)
        self.block = kc.block_rows(self.k, field.dtype.itemsize)
        self.blocks = -(-capacity // self.block)
        self.P = kc.tree_leaves(capacity, self.block)
        nodes = 2 * self.P
        a = allocator
        self.cnt = a.zeros(nodes, np.int64)
        self.vals = a.zeros((nodes, 4, self.k), np.float64)
        self.dirty = a.zeros(nodes, np.uint8)
        self.lanes = a.zeros((kc.LANE_ROWS, kc.lane_count(self.k)), np.float64)
        self.out = a.zeros((5, self.k), np.float64)
        self.x = None  # the field's values as the kernels read them (bind): (x, flat)
        self.kernels = [None, None]  # stats_ranges, stats_dirty for them (kernel())
        self.marked = False  # some dirty flag is set
        self.cached = None  # the FieldStats of the root, until the tree changes

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in (self.cnt, self.vals, self.dirty, self.lanes, self.out)))

    def kernel(self, dirty: bool):
        """``stats_dirty`` (``dirty``) or ``stats_ranges``, specialized to this tree's arrays:
        compiled, or loaded from the cache, at its first use (statistics never read, or never
        marked, compile nothing)."""
        got = self.kernels[dirty]
        if got is None:
            kc = self.kc
            if dirty:
                args = (*self.x, self.k, 0, self.block, self.dirty, self.lanes, self.cnt, self.vals)
            else:
                args = (*self.x, self.k, 0, self.block, 0, 0, 0, 0, self.lanes, self.cnt, self.vals)
            got = self.kernels[dirty] = kc.strided(kc.stats_dirty if dirty else kc.stats_ranges,
                                                   args, kc.STRIDED)
        return got

    def ranges(self, start: int, rows: int, capacity: int) -> tuple:
        """Block ranges ``(lo1, hi1, lo2, hi2)`` holding ring slots ``start, start + 1, ...``
        (``rows`` of them, fewer than ``capacity``; ``rows >= capacity`` means every block)."""
        if rows >= capacity:
            return 0, self.blocks, 0, 0
        stop = start + rows
        B = self.block
        if stop <= capacity:
            return start // B, (stop - 1) // B + 1, 0, 0
        return start // B, self.blocks, 0, (stop - capacity - 1) // B + 1

    def summary(self) -> FieldStats:
        if self.cached is None:
            n = self.kc.stats_summary(self.cnt, self.vals, self.out)
            self.cached = FieldStats(self.field.name, n, self.out, self.field.shape)
        return self.cached


class RunningStats:
    """The running statistics of some fields of a buffer: a write hook that hears only laps of
    the ring (see the module docstring), and the trees it keeps up to date when read.

    Parameters
    ----------
    spec : Spec
        The stored fields.
    names : tuple of str
        From :func:`check_stats_fields`.
    capacity : int
    allocator : tfdata.alloc.Allocator
    """

    hears_writes = True
    #: needs no call per row: only ``on_wrap`` from the generated push and extend, and
    #: ``on_write`` from the writer's generic path (see :mod:`tfdata.replay.writers`)
    wraps_only = True

    def __init__(self, spec, names: tuple, capacity: int, allocator):
        self.names = tuple(names)
        self.capacity = capacity
        self.trees = {n: _Tree(spec[n], capacity, allocator) for n in self.names}
        self.wraps = 0  # laps of the ring written (this counter and the cursor place every write)
        self.synced = 0  # laps * capacity + cursor when the trees were last brought up to date
        self.marked = False  # some tree has blocks flagged by mark()
        self.writer = None

    def bind(self, storage, writer) -> None:
        """Once: where the rows are, and the writer whose cursor and size say which are live."""
        from ..kernels import _columns as kc

        self.kc = kc  # bound once: an import statement on every read costs more than the read
        # a proxy: the writer holds this hook, and a strong reference back would be a cycle
        # keeping the storage alive until the cyclic GC runs
        self.writer = weakref.proxy(writer)
        for name, t in self.trees.items():
            t.x = kc.operand(storage.column(name))
            kc.stats_clear(t.cnt, t.vals, t.dirty)  # empty nodes, as a clear leaves them

    @property
    def nbytes(self) -> int:
        return int(sum(t.nbytes for t in self.trees.values()))

    # -- write hooks (lock held) -------------------------------------------------------------
    def on_write(self, spans, n: int, extra) -> None:
        # called before the cursor moves (over ``moving`` slots, n unless a gate placed the
        # rows past slots it skipped): count the laps this write completes
        self.wraps += (self.writer.cursor + self.writer.moving) // self.capacity

    def on_wrap(self) -> None:
        self.wraps += 1

    def slot_hook(self):
        return None  # wraps_only: never asked for a per-row form

    def on_clear(self) -> None:
        for t in self.trees.values():
            self.kc.stats_clear(t.cnt, t.vals, t.dirty)
            t.marked = False
            t.cached = None
        self.wraps = 0
        self.synced = 0
        self.marked = False

    # -- reading (lock held) -----------------------------------------------------------------
    def sync(self) -> None:
        """Recompute the blocks written or marked since the last call, and their ancestors."""
        w = self.writer
        pos = self.wraps * self.capacity + w.cursor
        if pos == self.synced and not self.marked:  # current: what every sample of Normalize asks
            return
        moved = pos - self.synced
        live = w.size
        for t in self.trees.values():
            if moved:
                lo1, hi1, lo2, hi2 = t.ranges(self.synced % self.capacity, moved, self.capacity)
                (t.kernels[0] or t.kernel(False))(*t.x, t.k, live, t.block, lo1, hi1, lo2, hi2,
                                                  t.lanes, t.cnt, t.vals)
                t.cached = None
            if t.marked:
                (t.kernels[1] or t.kernel(True))(*t.x, t.k, live, t.block, t.dirty, t.lanes, t.cnt,
                                                 t.vals)
                t.marked = False
                t.cached = None
        self.synced = pos
        self.marked = False

    def read(self, name: str) -> FieldStats:
        self.sync()
        return self.trees[name].summary()

    def tree(self, name: str) -> tuple:
        """``(cnt, vals, moments)`` of field ``name``'s tree (int64 ``(nodes,)``, float64
        ``(nodes, 4, k)``, float64 ``(5, k)`` scratch), what a kernel reads the statistics of the
        rows held from after :meth:`sync` (:func:`tfdata.kernels._transforms.normalize`): the
        same arrays for the buffer's life."""
        t = self.trees[name]
        return t.cnt, t.vals, t.out

    def mark(self, name: str, slots: np.ndarray) -> None:
        """Rows ``slots`` (int64, each < capacity) of field ``name`` were rewritten in place."""
        t = self.trees.get(name)
        if t is None or slots.size == 0:
            return
        t.dirty[t.P + slots // t.block] = 1
        t.marked = self.marked = True
        t.cached = None

    def rebuild(self) -> None:
        """Every tree from the rows (after the rows were loaded); the writer's cursor is the
        reference from now on."""
        kc, live = self.kc, self.writer.size
        for t in self.trees.values():
            kc.stats_clear(t.cnt, t.vals, t.dirty)
            t.kernel(False)(*t.x, t.k, live, t.block, 0, t.blocks, 0, 0, t.lanes, t.cnt, t.vals)
            t.marked = False
            t.cached = None
        self.wraps = 0
        self.synced = self.writer.cursor
        self.marked = False

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """``{name: {"count", "mean", "var", "min", "max"}}`` of the live rows (arrays of the
        field's shape, float64, new)."""
        out = {}
        for name in self.names:
            s = self.read(name)
            out[name] = {"count": s.count, "mean": np.array(s.mean), "var": np.array(s.var),
                         "min": np.array(s.min), "max": np.array(s.max)}
        return out

    def check_state(self, stats, size: int, data) -> None:
        """Validate the ``stats`` of a state dict against ``data`` (its rows, one array per field,
        ``(size, *shape)`` in slot order, already checked): each entry of a field this buffer
        keeps statistics of must hold ``count == size`` and arrays of float64 and the field's shape
        equal, bit for bit (NaN where NaN), to the statistics of those rows (what the tree
        gives, deterministic: see the module docstring). Entries of other fields are ignored;
        a missing entry (a state saved without statistics) is computed from the rows. Raises
        ValueError naming the field; changes nothing."""
        if stats is None:
            return
        if not isinstance(stats, dict):
            raise ValueError(f"state stats: expected a dict of field name to statistics, got "
                             f"{type(stats).__name__}")
        for name, t in self.trees.items():
            entry = stats.get(name)
            if entry is None:
                continue
            if not isinstance(entry, dict) or set(entry) != {"count", "mean", "var", "min", "max"}:
                raise ValueError(f"state stats[{name!r}]: expected a dict with the keys count, mean, "
                                 f"var, min, max")
            count = entry["count"]
            if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or int(count) != size:
                raise ValueError(f"state stats[{name!r}].count: expected {size} (the rows held), "
                                 f"got {count!r}")
            for key in ("mean", "var", "min", "max"):
                a = entry[key]
                if not isinstance(a, np.ndarray) or a.dtype != np.float64 or a.shape != t.field.shape:
                    got = f"{a.dtype}{a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
                    raise ValueError(f"state stats[{name!r}].{key}: expected float64{t.field.shape}, "
                                     f"got {got}")
            fresh = self.of_rows(name, data[name], size)
            for key in ("mean", "var", "min", "max"):
                if not np.array_equal(entry[key], getattr(fresh, key), equal_nan=True):
                    raise ValueError(f"state stats[{name!r}].{key} differs from the statistics of "
                                     f"the state's rows ({entry[key].tolist()} against "
                                     f"{getattr(fresh, key).tolist()})")

    def of_rows(self, name: str, rows: np.ndarray, size: int) -> FieldStats:
        """What the tree of ``name`` would give for ``rows`` (``(size, *shape)`` in slot order),
        built in temporary arrays (the buffer's trees are not touched)."""
        from ..kernels import _columns as kc
        from .. import alloc

        t = self.trees[name]
        tmp = _Tree(t.field, self.capacity, alloc.resolve("numpy"))
        args = (*kc.operand(np.asarray(rows).reshape(size, t.k)), t.k, size, tmp.block, 0, tmp.blocks,
                0, 0, tmp.lanes, tmp.cnt, tmp.vals)
        kc.strided(kc.stats_ranges, args, kc.STRIDED)(*args)
        return tmp.summary()


def _scan_scratch(k: int) -> tuple:
    """``(lanes, cnt, vals, out)``: the scratch and output arrays of one column pass."""
    from ..kernels import _columns as kc

    return (np.zeros((kc.LANE_ROWS, kc.lane_count(k))), np.zeros(2, np.int64), np.zeros((2, 4, k)),
            np.zeros((5, k)))


def scan(field, view: np.ndarray, rows: int) -> FieldStats:
    """Statistics of rows ``[0, rows)`` of ``view`` (``(capacity, k)``, as ``Storage.column``
    gives it) by one compiled pass: :func:`scan_ranges` over ``[[0, rows]]``."""
    return scan_ranges(field, view, np.array([[0, rows]], np.int64))


def scan_ranges(field, view: np.ndarray, ranges: np.ndarray) -> FieldStats:
    """Statistics of the rows of ``view`` (as in :func:`scan`) in ``ranges`` (int64[m, 2]: rows
    ``[ranges[i, 0], ranges[i, 1])``, in that order), by one compiled pass
    (:func:`tfdata.kernels._columns.column_scan_ranges`)."""
    from ..kernels import _columns as kc

    k = view.shape[1]
    lanes, cnt, vals, out = _scan_scratch(k)
    args = (*kc.operand(view), k, np.ascontiguousarray(ranges, np.int64), kc.SCAN_CHUNK, lanes, cnt,
            vals, out)
    n = kc.strided(kc.column_scan_ranges, args, kc.STRIDED)(*args)
    return FieldStats(field.name, n, out, field.shape)


# -- checkpoints: config.stats and state.stats, read as untrusted input; ``c`` is the
# checkpoint's checker of JSON values, ``arrays`` its reader of array files (exactly the dtype
# and shape asked for, checked from the header before anything is read)
#: the keys of each field's entry in ``state.stats``
STATE_KEYS = ("count", "mean", "var", "min", "max")


def read_names(c, where: str, v, spec) -> None:
    """A non-empty list of distinct field names (the constructor checks that each can have
    statistics); a buffer without statistics saves no ``stats`` key, so null or an empty
    list is no form a save writes."""
    if not isinstance(v, list) or not v or len(v) > len(spec):
        c.fail(where, f"a list of 1 to {len(spec)} field names (no key: no statistics)", v)
    for i, name in enumerate(v):
        if type(name) is not str or name not in spec:
            c.fail(f"{where}[{i}]", f"a field of the spec {list(spec.names)}", name)
    if len(set(v)) != len(v):
        c.fail(where, "distinct field names", v)


def read_state(c, arrays, st, names, spec, size: int) -> dict:
    """``state.stats``: absent exactly when ``config.stats`` (``names``) is (a save writes both
    or neither), else an object with an entry per field of ``config.stats`` and nothing else,
    each ``count`` equal to the rows held and arrays of float64 and the field's shape (read only
    then)."""
    if not names:
        if st is not None:
            c.fail("state.stats", "absent (config.stats names no field)", st)
        return {}
    if st is None:
        c.fail("state.stats", f"the statistics of {list(names)[:8]} (config.stats)", show=False)
    c.obj("state.stats", st, tuple(names))
    out = {}
    for name in names:
        w = f"state.stats[{name[:40]!r}]"
        entry = c.obj(w, st[name], STATE_KEYS)
        if type(entry["count"]) is not int or entry["count"] != size:
            c.fail(w + ".count", f"{size} (the rows held)", entry["count"])
        out[name] = {k: arrays.read(f"{w}.{k}", entry[k], np.float64, spec[name].shape)
                     for k in STATE_KEYS[1:]}
    return out


def compare_state(c, arrays, st, stats: dict, buf) -> None:
    """Each statistic read from the checkpoint must equal, bit for bit (NaN where NaN), what the
    loaded rows of ``buf`` give (a deterministic function of them: see the module docstring),
    so a value is finite, a variance non-negative, a min below its max exactly when the rows
    make them so; FormatError naming the array file and the field otherwise."""
    for name, values in stats.items():
        if name not in buf.stats_fields:  # load(stats=...) asked for other fields
            continue
        fresh = buf.stats(name)
        for key, want in values.items():
            if not np.array_equal(want, getattr(fresh, key), equal_nan=True):
                arrays.fail(st[name][key], f"state.stats[{name[:40]!r}].{key}: expected the "
                            f"statistics of the checkpoint's rows ({getattr(fresh, key).tolist()}), "
                            f"the file holds {want.tolist()}")
