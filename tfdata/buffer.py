"""The uniform replay buffer: a spec, a storage, a ring writer and a sampler behind one lock."""

from __future__ import annotations

import numbers
import os
import sys
import threading
import weakref
from collections.abc import Mapping

import numpy as np

from ._fastpath import make_push
from .errors import SpecError, StaleBatchError
from .sampler import UniformSampler
from .spec import Spec
from .episodes import Episodes, resolve_next_of, resolve_roles, stored_spec
from .memory import check_budget, parse_bytes
from .storage import WORD_TYPES, Output, make_storage, output_nbytes, storage_nbytes, word_size
from .writer import RingWriter

_STATE_FORMAT = "tfdata.ReplayBuffer"
_STATE_VERSION = 1
# Lemire's multiply-shift draws from the top 32 bits of each random word
MAX_CAPACITY = (1 << 32) - 1
# sample_sequences(policy="reject"): draws per slice before concluding no slice exists
_MAX_DRAWS = 10_000
# the constructor's arguments that change what a buffer holds (see ReplayBuffer.plan_memory)
_CONFIG_DEFAULTS = dict(layout=None, ring_size=2, num_envs=1, n_step=None, gamma=0.99,
                        next_of="auto", elide_next=False, roles=None, spill_path=None,
                        hot_rows=None, hot_bytes=None)


class Batch(Mapping):
    """A sampled batch: a read-only mapping of field name to ndarray, plus the sampled slots.

    Attributes
    ----------
    indices : ndarray of int64, shape (batch_size,)
        Storage slots the rows came from (what a prioritized buffer updates).
    weights : ndarray of float32, shape (batch_size,), or None
        Importance-sampling weights (prioritized buffers only).
    versions : ndarray of uint64, shape (batch_size,), or None
        How many times each sampled slot had been written (prioritized buffers only): lets
        ``update_priorities(batch, ...)`` refuse slots overwritten since the sample.
    discounts : ndarray of float32, shape (batch_size,), or None
        ``gamma ** k`` for the ``k`` steps each n-step window took (buffers built with
        ``n_step``): the bootstrap target is ``reward + discounts * (1 - terminated) * V(next_obs)``.
    mask : ndarray of bool, shape (batch_size, length), or None
        Which rows of a :meth:`ReplayBuffer.sample_sequences` slice belong to its episode.

    Notes
    -----
    Arrays returned by ``sample(copy=False)`` are views into the buffer's output ring. They stay
    valid until the same thread has called ``sample`` with the same batch size ``ring_size`` more
    times; after that the same memory holds a newer batch. Each thread has its own ring.
    Keep a batch longer with ``sample(copy=True)`` or :meth:`copy`. The mapping itself is
    read-only (it is reused by the ring); ``dict(batch)`` gives a mutable one.

    *A batch knows when it is stale.* When a sample reuses a ring slot whose previous batch is
    still referenced (kept in a list, held by another thread, ...), that batch is retired: from
    then on reading a field, its attributes, iterating it, :meth:`copy` or passing it to
    ``update_priorities`` raise :class:`tfdata.StaleBatchError`, instead of silently showing
    (or updating the priorities of) the rows of a newer batch. A batch nobody holds any more is
    reused as it is, so the common loop allocates nothing and reads fields at full speed.
    Arrays taken out of a batch before that (``obs = batch["obs"]``) are plain views and are
    not protected. Batches from ``copy=True`` or :meth:`copy` never go stale.
    """

    __slots__ = ("_fields", "indices", "weights", "versions", "discounts", "mask")

    def __init__(self, fields, indices, weights=None, versions=None, discounts=None, mask=None):
        self._fields = dict(fields)
        self.indices = indices
        self.weights = weights
        self.versions = versions
        self.discounts = discounts
        self.mask = mask

    def __getitem__(self, name):
        return self._fields[name]

    def __iter__(self):
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def copy(self) -> "Batch":
        """A deep copy with C-contiguous arrays, valid forever."""
        def dup(a):
            return None if a is None else a.copy()

        return Batch({k: np.array(v, order="C") for k, v in self._fields.items()}, self.indices.copy(),
                     dup(self.weights), dup(self.versions), dup(self.discounts), dup(self.mask))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k!r}: {v.dtype}{list(v.shape)}" for k, v in self._fields.items())
        return f"Batch({{{inner}}}, indices=int64{list(self.indices.shape)})"

    def _retire(self) -> "Batch":
        """Make this batch stale and return a fresh one with the same contents (the ring's next
        batch of this slot). Used when the slot is about to be reused while this batch is held."""
        cls = type(self)
        fresh = object.__new__(cls)
        for name in _slot_names(cls):
            try:
                setattr(fresh, name, getattr(self, name))
            except AttributeError:  # a slot never set
                pass
        self.__class__ = _stale_class(cls)
        return fresh


_SLOT_NAMES: dict = {}
_STALE_CLASSES: dict = {}
_STALE_MESSAGE = ("this batch is stale: its output-ring slot was reused by a later sample, so its "
                  "arrays now hold another batch's rows (a batch from sample(copy=False) is valid "
                  "until this thread has sampled ring_size more batches of the same size); keep a "
                  "batch longer with sample(copy=True) or batch.copy() while it is valid")


def _slot_names(cls) -> tuple:
    names = _SLOT_NAMES.get(cls)
    if names is None:
        names = _SLOT_NAMES[cls] = tuple(n for c in cls.__mro__ for n in getattr(c, "__slots__", ())
                                         if n not in ("__weakref__", "__dict__"))
    return names


def _stale_class(cls) -> type:
    """The stale twin of a Batch class: same memory layout (so ``__class__`` can be switched),
    every field, attribute and method raising :class:`StaleBatchError`; ``repr`` still works."""
    stale = _STALE_CLASSES.get(cls)
    if stale is not None:
        return stale

    def refuse(self, *args, **kwargs):
        raise StaleBatchError(_STALE_MESSAGE)

    def refused(self):
        raise StaleBatchError(_STALE_MESSAGE)

    def stale_repr(self):
        return f"<stale {cls.__name__}: its ring slot was reused by a later sample>"

    ns = {"__slots__": (), "__repr__": stale_repr, "__doc__": f"A stale {cls.__name__}."}
    for name in ("__getitem__", "__iter__", "__len__", "__contains__", "__eq__", "get", "keys",
                 "items", "values", "copy", "copy_with_metrics", "__reduce_ex__", "__reduce__",
                 "__copy__", "__deepcopy__"):
        ns[name] = refuse
    for name in _slot_names(cls):
        if not name.startswith("_"):
            ns[name] = property(refused)
    stale = _STALE_CLASSES[cls] = type(f"Stale{cls.__name__}", (cls,), ns)
    return stale


def _unheld_refcount() -> int:
    """What ``sys.getrefcount(batch)`` gives, in the shape :meth:`ReplayBuffer.sample` calls it,
    for a batch that only its ring's list refers to (measured: it differs between Pythons)."""
    batches = [Batch({}, None)]
    batch = batches[0]
    return _getrefcount(batch)


_getrefcount = sys.getrefcount
_UNHELD = _unheld_refcount()


class _OutputRing:
    """``ring_size`` preallocated outputs for one batch shape, handed out in turn.

    ``length`` None: batches of ``batch_size`` rows. ``length`` L: ``batch_size`` slices of L rows,
    gathered as ``batch_size * L`` rows and shown as ``(batch_size, L, ...)`` views.
    """

    __slots__ = ("slots", "batches", "next", "weights", "scratch", "versions", "extra", "nbytes",
                 "__weakref__")

    def __init__(self, buffer: "ReplayBuffer", batch_size: int, ring_size: int,
                 length: int | None = None):
        rows = batch_size * (length or 1)
        weighted = buffer._weighted and length is None
        a = buffer.allocator
        self.slots: list[Output] = [buffer._storage.new_output(rows) for _ in range(ring_size)]
        # per slot: importance weights (float32) and float64 scratch, for weighted samplers
        self.weights = [a.zeros(batch_size, np.float32) if weighted else None for _ in self.slots]
        self.scratch = [a.zeros(batch_size, np.float64) if weighted else None for _ in self.slots]
        self.versions = [a.zeros(batch_size, np.uint64) if weighted else None for _ in self.slots]
        # per slot: what the episode post-processing writes (see ReplayBuffer._make_extra)
        self.extra = [buffer._make_extra(o, rows, length is not None) for o in self.slots]
        self.batches = []
        for o, w, v, x in zip(self.slots, self.weights, self.versions, self.extra):
            fields = {}
            for name in buffer.spec.names:
                arr = o.fields[name] if name in o.fields else x["next"][name]
                fields[name] = arr if length is None else arr.reshape((batch_size, length) + arr.shape[1:])
            if length is None:
                self.batches.append(Batch(fields, o.indices, w, v, x.get("discount")))
            else:
                self.batches.append(Batch(fields, o.indices.reshape(batch_size, length),
                                          mask=x["mask"].reshape(batch_size, length)))
        self.next = 0
        self.nbytes = _owned_nbytes(self)


def _owned_nbytes(ring: "_OutputRing") -> int:
    """Bytes of the distinct arrays a ring allocated (views counted once, through their owner)."""
    arrays = []
    for o, w, sc, v, x in zip(ring.slots, ring.weights, ring.scratch, ring.versions, ring.extra):
        arrays.append(o.indices)
        arrays.extend([o.records] if o.records is not None else o.fields.values())
        arrays.extend(a for a in (w, sc, v) if a is not None)
        arrays.extend(x.get("next", {}).values())
        arrays.extend(x[k] for k in ("mask", "discount", "last", "acc") if k in x)
    return int(sum(arr.nbytes for arr in arrays))


def _weak_method(obj, name: str):
    """``getattr(obj, name)`` as a function that does not keep ``obj`` alive.

    A bound method stored on its own object is a reference cycle: the buffer (and its storage,
    possibly gigabytes) would then wait for the cyclic garbage collector after ``del``.
    """
    ref = weakref.ref(obj)
    func = getattr(type(obj), name)

    def call(*args):
        return func(ref(), *args)

    return call


def _check_int(name: str, value, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def _check_unit(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return value


class ReplayBuffer:
    """A fixed-capacity circular replay buffer with uniform sampling.

    Parameters
    ----------
    spec : Spec or mapping
        The row schema, or anything :class:`Spec` accepts.
    capacity : int
        Number of rows, ``1 <= capacity < 2**32``. Storage is allocated once, here.
    layout : {"aos", "soa"}, optional
        Physical layout. Default: the ``TFDATA_LAYOUT`` environment variable, else ``"aos"``.
        The layout changes speed and memory, never results: the same seed gives bit-identical
        batches on both.
    seed : int, optional
        Seed of the sampling generator; None draws one (recorded in :meth:`state_dict`).
    ring_size : int, default 2
        Number of preallocated output batches per batch size (see :class:`Batch`).
    num_envs : int, default 1
        Parallel environment streams. Rows are interleaved step by step (env ``e``'s row of step
        ``t`` in slot ``(t * num_envs + e) % capacity``); the capacity must be a multiple of
        ``num_envs``, ``extend`` takes whole steps and ``push`` needs ``num_envs == 1``.
    n_step : int, optional
        Sample n-step transitions: ``reward`` holds the discounted return of up to ``n_step``
        rows of the stream, ``terminated``/``truncated``/``next_obs`` those of the window's last
        row, and ``batch.discounts`` is ``gamma ** k`` for the ``k`` rows taken. Windows stop at
        an episode end and at the newest row. Needs ``terminated``, ``truncated`` and a float
        ``reward`` field.
    gamma : float, default 0.99
        Discount of the n-step return, in ``[0, 1]``.
    next_of : "auto", mapping or None
        Which fields hold the next value of another (``{"next_obs": "obs"}``); "auto" pairs every
        ``next_X`` with ``X`` of the same dtype and shape. n-step reads them at the window's end.
    elide_next : bool, default False
        Do not store the next fields: read them from the stream's next row (episode-ending rows
        keep theirs aside). Same samples, less memory; each row's ``obs`` must then equal the
        previous row's ``next_obs`` unless that row ended an episode (else SpecError).
    roles : mapping, optional
        Field names of the roles ``reward``, ``terminated``, ``truncated`` if not those.
    spill_path : str or path, optional
        Keep the rows in this file (an AoS ``.npy`` or an SoA directory, created sparse; the
        path must not exist: FileExistsError, nothing is replaced) instead of RAM: a capacity larger than memory. Sampling,
        writing and wrap-around are unchanged (one true ring); only the ``hot_rows`` newest rows
        stay resident, older pages are released (see :mod:`tfdata.spill`). Needs exactly one
        of ``hot_rows`` and ``hot_bytes``.
    hot_rows : int, optional
        Rows kept resident by a spilling buffer.
    hot_bytes : int or str, optional
        The same as bytes (``"64MB"``, ``"1.5GiB"``; k, M, G are powers of 1024).
    allocator : str or tfdata.alloc.Allocator, optional
        Where every array of the buffer comes from (rows, output rings, trees, bookkeeping):
        ``"numpy"``, ``"jemalloc"``, ``"mimalloc"``, ``"hugepages"`` or ``"nohugepages"`` (see
        :mod:`tfdata.alloc`). Default: the ``TFDATA_ALLOCATOR`` environment variable, else
        ``"numpy"``. Results never depend on it.
    memory_budget : int or str, optional
        Bytes (or ``"400MB"``) the buffer may hold in all, as :attr:`nbytes` counts them. Checked
        before anything is allocated: construction over budget, the output ring of a new batch
        size, or a growth of the episode-final table (``elide_next``) raises
        :class:`tfdata.MemoryBudgetError` and changes nothing. :func:`tfdata.memory.max_capacity`
        gives the largest capacity that fits.

    Notes
    -----
    *Sampling* is uniform **with replacement** over the rows currently held, and needs
    ``1 <= batch_size <= len(buffer)``: a batch larger than the data is almost always a
    configuration error (learning starts before the buffer holds a batch).

    *Threads*: one writer and any number of samplers may share a buffer. Writes and samples are
    serialised by an internal lock, and kernels release the GIL, so other Python threads
    (an environment, a learner) keep running while a sample is gathered. A sampler never sees a
    row that is half written.

    *Steady state allocates nothing*: push and extend write in place; sample reuses its output
    ring. The first ``sample`` with a new batch size allocates that size's ring.

    *Episodes* are tracked when the spec has bool ``terminated`` and ``truncated`` fields: each
    row gets its stream's episode number at insert, which :meth:`sample_sequences` uses.
    """

    _weighted = False  # whether sampled batches carry importance weights

    def __init__(self, spec, capacity: int, *, layout: str | None = None, seed: int | None = None,
                 ring_size: int = 2, num_envs: int = 1, n_step: int | None = None,
                 gamma: float = 0.99, next_of="auto", elide_next: bool = False, roles=None,
                 spill_path=None, hot_rows: int | None = None, hot_bytes=None,
                 allocator=None, memory_budget=None):
        from . import alloc

        self._configure(spec, capacity, layout=layout, ring_size=ring_size, num_envs=num_envs,
                        n_step=n_step, gamma=gamma, next_of=next_of, elide_next=elide_next,
                        roles=roles, spill_path=spill_path, hot_rows=hot_rows, hot_bytes=hot_bytes)
        capacity = self._capacity
        self.allocator = alloc.resolve(allocator)
        self.memory_budget = None if memory_budget is None else parse_bytes("memory_budget", memory_budget)
        if self.memory_budget is not None:  # refuse before allocating anything
            self._check_budget(self._planned_parts(), f"{type(self).__name__} of capacity {capacity}",
                               construction=True)
        self._rings = weakref.WeakSet()  # every thread's output rings, for nbytes
        self._episodes = None
        if self._has_flags:
            self._episodes = Episodes(self.spec, capacity, self.num_envs, self._roles, self.next_of,
                                      self.elide_next, self.allocator, _weak_method(self, "_grow_budget"))
        stored = self._stored
        self._spill = None
        if self.spill_path is None:
            self._storage = make_storage(stored, capacity, self._layout, allocator=self.allocator)
        else:
            self._storage = self._spill_storage(stored, capacity, self._layout)
        self._writer = RingWriter(capacity)
        self._sampler = UniformSampler(seed)
        self._lock = threading.Lock()
        # output rings are per thread: a thread's batch stays valid until that same thread has
        # sampled ring_size more times, whatever other threads do
        self._local = threading.local()
        # bound once: the sample path does no attribute lookups through the storage
        self._sample_kernel = self._storage.kernels.sample_uniform
        self._kernel_store = self._storage.kernel_store
        self._plan_episode_kernels()
        self._fast_push = self._make_fast_push()

    def _make_fast_push(self, on_write=None):
        """The per-spec push (``tfdata._fastpath``) where this buffer allows one, else the
        generic validated push. ``on_write(slot)`` runs under the lock after each row."""
        ep = self._episodes
        if self.num_envs == 1 and (ep is None or not ep.elide) and self._spill is None:
            return make_push(self.spec, self._storage.field_views(), self._writer, self._lock,
                             _weak_method(self, "_checked_push"),
                             None if ep is None else (ep.episode, ep.current, ep.term_i, ep.trunc_i),
                             on_write)
        return _weak_method(self, "_checked_push")

    def _configure(self, spec, capacity, *, layout, ring_size, num_envs, n_step, gamma, next_of,
                   elide_next, roles, spill_path, hot_rows, hot_bytes) -> None:
        """Check the arguments and derive what the buffer will hold; allocates nothing."""
        from ._config import resolve_layout

        self.spec = spec if isinstance(spec, Spec) else Spec(spec)
        capacity = _check_int("capacity", capacity, 1, MAX_CAPACITY)
        self._ring_size = _check_int("ring_size", ring_size, 1)
        self.num_envs = _check_int("num_envs", num_envs, 1)
        if capacity % self.num_envs:
            lo = capacity - capacity % self.num_envs
            raise ValueError(f"capacity must be a multiple of num_envs={self.num_envs} (streams are "
                             f"interleaved step by step), got {capacity}; use {lo or self.num_envs} or "
                             f"{lo + self.num_envs}")
        self._capacity = capacity
        self.n_step = None if n_step is None else _check_int("n_step", n_step, 1)
        self.gamma = _check_unit("gamma", gamma)
        self._roles = resolve_roles(self.spec, roles)
        self.next_of = resolve_next_of(self.spec, next_of)
        self.elide_next = bool(elide_next)
        self._has_flags = "terminated" in self._roles and "truncated" in self._roles
        if not self._has_flags and (self.n_step is not None or self.elide_next):
            what = "n_step" if self.n_step is not None else "elide_next"
            raise SpecError(f"{what} needs episode boundaries: the spec must have bool fields "
                            f"'terminated' and 'truncated' (or name them with roles=), has "
                            f"{list(self.spec.names)}")
        if self.elide_next and not self.next_of:
            raise SpecError("elide_next=True but no field is the next of another: declare "
                            "next_of={'next_obs': 'obs'} (or name fields next_X and X)")
        if self.n_step is not None:
            if "reward" not in self._roles:
                raise SpecError(f"n_step needs a 'reward' field (or name it with roles=), fields: "
                                f"{list(self.spec.names)}")
            rf = self.spec[self._roles["reward"]]
            if rf.shape or rf.dtype.kind != "f":
                raise SpecError(f"field {rf.name!r} (reward) must be a float scalar for n-step "
                                f"returns, got {rf.dtype}{list(rf.shape)}")
        self._stored = stored_spec(self.spec, self.next_of, self._has_flags and self.elide_next)
        self._layout = resolve_layout(layout)
        self.hot_rows = None  # rows kept resident, for a spilling buffer
        self.spill_path = None if spill_path is None else os.fspath(spill_path)
        if self.spill_path is None:
            if hot_rows is not None or hot_bytes is not None:
                raise ValueError("hot_rows / hot_bytes need spill_path (the file that holds the cold rows)")
            return
        if (hot_rows is None) == (hot_bytes is None):
            raise ValueError("spill_path needs exactly one of hot_rows= or hot_bytes= (the part kept in RAM)")
        row = self._row_nbytes()
        if hot_bytes is not None:
            hot_rows = parse_bytes("hot_bytes", hot_bytes) // row
        self.hot_rows = min(_check_int("hot_rows", hot_rows, 1), capacity)

    def _row_nbytes(self) -> int:
        return storage_nbytes(self._stored, 1, self._layout)

    def _spill_storage(self, stored: Spec, capacity: int, layout: str):
        from .io import map_storage
        from .spill import Spill

        data, maps = map_storage(self.spill_path, stored, capacity, layout)
        self._spill = Spill(maps, capacity, self.hot_rows, self._row_nbytes())
        return make_storage(stored, capacity, layout, backing=data, allocator=self.allocator)

    # -- memory -----------------------------------------------------------------------------
    @classmethod
    def plan_memory(cls, spec, capacity: int, *, batch_sizes=(), **options) -> dict:
        """The bytes a buffer built with these arguments would hold, by part, without building it.

        ``batch_sizes``: batch sizes to be sampled, each adding an output ring (a pair
        ``(batch_size, length)`` for :meth:`sample_sequences`). Returns the same
        keys as :attr:`nbytes_parts`. ``memory_budget=`` checks this plan before allocating.
        """
        plan = cls.__new__(cls)
        plan._plan_options(options)
        plan._configure(spec, capacity, **{k: options.get(k, v) for k, v in _CONFIG_DEFAULTS.items()})
        return plan._planned_parts(batch_sizes)

    def _plan_options(self, options: dict) -> None:
        """Validate the keyword arguments of :meth:`plan_memory` (a subclass takes more)."""
        for k in ("seed", "allocator", "memory_budget"):  # no effect on the bytes held
            options.pop(k, None)
        bad = set(options) - set(_CONFIG_DEFAULTS)
        if bad:
            raise TypeError(f"plan_memory: unexpected keyword(s) {sorted(bad)}; allowed: "
                            f"{sorted(_CONFIG_DEFAULTS)}")

    def _planned_parts(self, batch_sizes=()) -> dict:
        cap = self._capacity
        storage = storage_nbytes(self._stored, cap if self.hot_rows is None else self.hot_rows, self._layout)
        book = 0
        if self._has_flags:
            book = Episodes.planned_nbytes(self.spec, cap, self.num_envs, self.next_of, self.elide_next)
        rings = sum(self._ring_size * (self._planned_ring(*b) if isinstance(b, tuple) else self._planned_ring(b))
                    for b in batch_sizes)
        return {"storage": storage, "bookkeeping": book, "trees": 0, "output_rings": rings}

    def _planned_ring(self, batch_size: int, length: int | None = None) -> int:
        """Bytes of one slot of an output ring (see :class:`_OutputRing`)."""
        rows = batch_size * (length or 1)
        total = output_nbytes(self._stored, rows, self._layout)
        if self._weighted and length is None:
            total += batch_size * (4 + 8 + 8)  # weights, scratch, versions
        if self._has_flags:
            if self.elide_next:
                total += rows * sum(self.spec[n].nbytes for n in self.next_of)
            if length is not None:
                total += rows  # mask
            elif self.n_step is not None:
                total += rows * (4 + 8 + 8)  # discount, last, acc
        return total

    @property
    def nbytes_parts(self) -> dict:
        """Bytes this buffer holds in memory, by part (all ints).

        ``storage``: the rows (for a spilling buffer, the ``hot_rows`` kept resident; the file
        holds the rest). ``bookkeeping``: episode numbers, elided final values, slot versions.
        ``trees``: priority trees. ``output_rings``: the preallocated batches of every thread
        and batch size sampled so far.
        """
        storage = self._storage.nbytes if self.hot_rows is None else self.hot_rows * self._row_nbytes()
        book = 0 if self._episodes is None else self._episodes.nbytes
        rings = sum(r.nbytes for r in list(self._rings))
        return {"storage": int(storage), "bookkeeping": int(book), "trees": 0, "output_rings": int(rings)}

    @property
    def nbytes(self) -> int:
        """Total of :attr:`nbytes_parts`: every byte of memory this buffer allocated."""
        return sum(self.nbytes_parts.values())

    def _check_budget(self, parts: dict, what: str, construction: bool = False) -> None:
        from .memory import max_capacity

        fits = None
        if construction and sum(parts.values()) > self.memory_budget:
            opts = {k: getattr(self, a) for k, a in (("layout", "_layout"), ("num_envs", "num_envs"),
                                                     ("n_step", "n_step"), ("elide_next", "elide_next"))}
            cap = max_capacity(self.spec, self.memory_budget, prioritized=self._weighted,
                               next_of=self.next_of, roles=self._roles, **opts)
            fits = f"the largest capacity that fits is {cap}" if cap else "no capacity fits"
        check_budget(self.memory_budget, parts, what, fits)

    def _grow_budget(self, extra: int) -> None:
        """Refuse (MemoryBudgetError) a growth of ``extra`` bytes that would exceed the budget."""
        if self.memory_budget is not None:
            parts = self.nbytes_parts
            parts["growth"] = extra
            self._check_budget(parts, "growing the table of episode-final values")

    def _plan_episode_kernels(self) -> None:
        """Bind what the episode post-processing of a sample needs (once, at construction)."""
        from . import kernels

        self._k = kernels
        ep = self._episodes
        self._post = ep is not None and (self.n_step is not None or ep.elide)
        if ep is None:
            return
        st = self._storage
        names = st.spec.names
        self._flag_views = (st.field(self._roles["terminated"]), st.field(self._roles["truncated"]))
        self._reward_view = st.field(self._roles["reward"]) if "reward" in self._roles else None
        # full mode: next fields are stored; n-step re-reads them at the window's last row
        self._copy_pairs = []
        # elision: next fields are read from the source field of the stream's next row
        self._elide_pairs = []
        for nxt, src in self.next_of.items():
            width = self.spec[nxt].nbytes
            if nxt in names:
                word = word_size(st.field_offset(nxt), width)
                self._copy_pairs.append((nxt, word, st.field_words(nxt, word)))
            else:
                word = word_size(st.field_offset(src), width)
                self._elide_pairs.append((nxt, word, st.field_words(src, word)))

    def _make_extra(self, out: Output, rows: int, sequences: bool) -> dict:
        """Per-output arrays of the episode post-processing (and the elided fields' outputs)."""
        x = {"next": {}}
        ep = self._episodes
        if ep is None:
            return x
        for nxt, word, _ in self._elide_pairs:
            f = self.spec[nxt]
            arr = self.allocator.zeros((rows,) + f.shape, f.dtype)
            x["next"][nxt] = arr
            x.setdefault("next_words", {})[nxt] = arr.reshape(rows, -1).view(np.uint8).view(
                WORD_TYPES[word])
        if sequences:
            x["mask"] = self.allocator.zeros(rows, bool)
            return x
        if self.n_step is not None:
            x["discount"] = self.allocator.zeros(rows, np.float32)
            x["last"] = self.allocator.zeros(rows, np.int64)
            x["acc"] = self.allocator.zeros(rows, np.float64)
            x["copy_words"] = [self._storage.output_words(out, nxt, word)
                               for nxt, word, _ in self._copy_pairs]
        return x

    # -- introspection ----------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._writer.capacity

    @property
    def layout(self) -> str:
        return self._storage.layout

    @property
    def storage(self):
        """The storage object (``AoSStorage`` or ``SoAStorage``)."""
        return self._storage

    def __len__(self) -> int:
        return self._writer.size

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(len={len(self)}, capacity={self.capacity}, "
                f"layout={self.layout!r}, fields={list(self.spec.names)})")

    # -- writing ----------------------------------------------------------------------------
    def push(self, row: Mapping) -> None:
        """Append one row; once full, the oldest row is overwritten.

        Parameters
        ----------
        row : mapping of str to array_like
            One value per field, of shape ``spec[name].shape``. Values are cast to the field's
            dtype only when no data can be lost.

        Raises
        ------
        SpecError
            Missing, unknown or misspelled fields, wrong shapes, unsafe casts, junk. The buffer is
            unchanged.
        """
        self._fast_push(row)

    def _checked_push(self, row: Mapping) -> None:
        # the generic path: full validation with precise errors, then the same writes
        self._push_values(self.spec.check_row(row))

    def _push_values(self, values: list, extra=None) -> None:
        """Write one validated row (values in field order) and run the write hooks."""
        if self.num_envs > 1:
            raise SpecError(f"push appends one row, but this buffer interleaves num_envs="
                            f"{self.num_envs} streams: extend with {self.num_envs} rows per step")
        ep = self._episodes
        if ep is None or not ep.elide:  # write the values as they are
            with self._lock:
                w = self._writer
                pos = w.cursor
                self._storage.write_row(pos, values)
                if ep is not None:
                    ep.stamp_one(pos, values)
                self._on_write([(pos, 0, 1)], extra)
                w.advance(1)
                if self._spill is not None:
                    self._spill.after_write(1)
            return
        # elision checks and keeps rows as arrays: go through the batch path
        arrays = [np.asarray(v, f.dtype).reshape((1,) + f.shape) for v, f in zip(values, self.spec)]
        with self._lock:
            self._write_locked(arrays, 1, extra)

    def extend(self, batch: Mapping) -> None:
        """Append ``n`` rows given as one array per field, each with leading dimension ``n``.

        The step of a gymnasium vector env (``num_envs`` rows) fits as is; several steps fit as
        ``steps * num_envs`` rows in time-major order. When ``n`` exceeds the capacity, the result
        is that of ``n`` pushes: the last ``capacity`` rows remain.

        Raises
        ------
        SpecError
            As :meth:`push`, when fields disagree on ``n``, when ``n`` is not a multiple of
            ``num_envs``, and (``elide_next``) when a stream is not continuous. The buffer is
            unchanged.
        """
        n, values = self.spec.check_batch(batch)
        if n == 0:
            return
        with self._lock:
            self._write_locked(values, n, None)

    def _write_locked(self, values: list, n: int, extra) -> None:
        """Write ``n`` validated rows (lock held). Everything that can refuse runs first."""
        w = self._writer
        if n <= w.capacity - w.cursor:  # no wrap: one span
            spans = [(w.cursor, 0, n)]
        else:
            spans = w.spans(n)
        ep = self._episodes
        stored = values
        if ep is not None:
            ends = ep.ends(values) if ep.elide else None
            ep.check(values, n)
            ep.reserve(ends, spans)
            if ep.elide:
                stored = [values[i] for i in ep.stored_pos]
        elif n % self.num_envs:
            raise SpecError(f"this buffer interleaves num_envs={self.num_envs} streams: extend "
                            f"takes whole steps of {self.num_envs} rows each, got {n} rows")
        for dst, src, count in spans:
            self._storage.write_rows(dst, stored, src, count)
        if ep is not None:
            ep.write(values, n, ends, spans)
        self._on_write(spans, extra)
        w.advance(n)
        if self._spill is not None:
            self._spill.after_write(n)

    def _on_write(self, spans: list, extra) -> None:
        """Update what a subclass keeps per row for rows just written at ``spans`` (lock held)."""

    def clear(self, *, wipe: bool = False) -> None:
        """Forget every row. ``wipe=True`` also overwrites the storage with zeros."""
        with self._lock:
            self._writer.reset()
            if wipe:
                self._storage.wipe()
            if self._spill is not None:
                self._spill.reset()
            if self._episodes is not None:
                self._episodes.clear(wipe)
            self._on_clear()

    def _on_clear(self) -> None:
        """Reset what a subclass keeps per row (called under the lock)."""

    # -- sampling ---------------------------------------------------------------------------
    def sample(self, batch_size: int, *, copy: bool = False) -> Batch:
        """Draw ``batch_size`` rows uniformly with replacement.

        Parameters
        ----------
        batch_size : int
            ``1 <= batch_size <= len(self)``.
        copy : bool, default False
            False returns views into this thread's output ring (valid until this thread has
            sampled ``ring_size`` more batches of this size; a batch still held then is
            retired, see :class:`Batch`); True returns arrays that are the caller's to keep.

        Raises
        ------
        ValueError
            ``batch_size`` larger than ``len(self)``: checked before the output ring of a new
            batch size is allocated, so a refused call takes no memory.

        Returns
        -------
        Batch
            ``batch[name]`` has dtype ``spec[name].dtype`` and shape
            ``(batch_size, *spec[name].shape)``; ``batch.indices`` (int64, ``(batch_size,)``)
            holds the storage slots. A prioritized buffer also sets ``batch.weights`` (float32
            importance weights, at most 1) and ``batch.versions``.
        """
        if type(batch_size) is not int:  # 2.0 or True would find the ring of 2 or 1
            batch_size = _check_int("batch_size", batch_size, 1)
        try:
            ring = self._local.rings[batch_size]
        except (AttributeError, KeyError, TypeError):
            n = self._writer.size
            if batch_size > n:  # check, then allocate: a refused sample builds no ring
                raise ValueError(self._too_few_rows(batch_size, n))
            ring = self._new_ring(batch_size)
        with self._lock:
            n = self._writer.size  # again: a clear() may have run since
            if batch_size > n:
                raise ValueError(self._too_few_rows(batch_size, n))
            i = ring.next
            ring.next = (i + 1) % len(ring.slots)
            self._gather(ring, i, n)
            if self._post:
                self._post_sample(ring.slots[i], ring.extra[i], ring.slots[i].indices)
            if self._spill is not None:
                self._spill.after_sample()
        batch = ring.batches[i]
        if _getrefcount(batch) > _UNHELD:  # the slot's previous batch is still held: retire it
            batch = ring.batches[i] = batch._retire()
        return batch.copy() if copy else batch

    def _post_sample(self, out: Output, x: dict, idx: np.ndarray) -> None:
        """n-step windows and elided next fields for the rows sampled at ``idx`` (lock held)."""
        rows = idx
        if self.n_step is not None:
            # after the gather, so the window's first row is in cache (a kernel fusing the two
            # measured slower: 54 vs 46 µs at 1M rows, AoS)
            k, f, r = self._k, out.fields, self._roles
            k.nstep_windows(idx, self._writer.cursor, self.num_envs, self.capacity, self.n_step,
                            self.gamma, self._reward_view, self._flag_views[0], self._flag_views[1],
                            x["acc"], f[r["reward"]], f[r["terminated"]], f[r["truncated"]],
                            x["discount"], x["last"])
            rows = x["last"]
            for (_, _, (src, off, width)), (dst, doff, _) in zip(self._copy_pairs, x["copy_words"]):
                k.copy_field_rows(src, off, rows, idx, dst, doff, width)
        if self._elide_pairs:
            self._read_elided(rows, x)

    def _read_elided(self, rows: np.ndarray, x: dict) -> None:
        """Fill the elided next fields of ``x`` with the next values of slots ``rows``."""
        ep = self._episodes
        for nxt, word, (src, off, width) in self._elide_pairs:
            self._k.copy_next_elided(rows, self._writer.cursor, self.num_envs, self.capacity, src,
                                     off, self._flag_views[0], self._flag_views[1], ep.final_idx, ep.final_words(nxt, word),
                                     ep.pending_words(nxt, word), x["next_words"][nxt], 0, width)

    def sample_sequences(self, batch_size: int, length: int, *, policy: str = "mask",
                         copy: bool = False) -> Batch:
        """Draw ``batch_size`` slices of ``length`` consecutive steps of one stream and episode.

        Parameters
        ----------
        batch_size, length : int
            ``1 <= batch_size <= len(self)`` (start rows are drawn with replacement, as in
            :meth:`sample`); ``1 <= length <= capacity // num_envs`` (no slice is longer than
            a stream can hold). Both are checked before any output is allocated.
        policy : {"mask", "reject"}
            What to do with a slice that would run past its episode's end (or past the newest
            row): ``"mask"`` keeps it, repeats its last valid row in the remaining positions and
            marks them False in ``batch.mask``; ``"reject"`` redraws the start until the whole
            slice lies in one episode (each check O(1)), and raises ValueError if no slice can
            be found (episodes shorter than ``length``).
        copy : bool
            As in :meth:`sample`.

        Returns
        -------
        Batch
            ``batch[name]`` has shape ``(batch_size, length, *spec[name].shape)``,
            ``batch.indices`` int64 ``(batch_size, length)``, ``batch.mask`` bool
            ``(batch_size, length)``. Start rows are uniform over the rows held (over the valid
            starts with ``"reject"``). Rows are the stored rows: no n-step processing.
        """
        ep = self._episodes
        if ep is None:
            raise SpecError("sample_sequences needs episode boundaries: the spec must have bool "
                            "fields 'terminated' and 'truncated' (or name them with roles=)")
        if policy not in ("mask", "reject"):
            raise ValueError(f"policy must be 'mask' or 'reject', got {policy!r}")
        batch_size = _check_int("batch_size", batch_size, 1)
        length = _check_int("length", length, 1)
        reject = policy == "reject"
        # check, then allocate: a refused call builds no ring
        self._check_slices(batch_size, length, reject, self._writer.size)
        key = ("seq", batch_size, length)
        try:
            ring = self._local.rings[key]
        except (AttributeError, KeyError):
            ring = self._new_ring(batch_size, length)
        with self._lock:
            n = self._writer.size
            self._check_slices(batch_size, length, reject, n)  # a clear() may have run since
            i = ring.next
            slot, x = ring.slots[i], ring.extra[i]
            idx = slot.indices.reshape(batch_size, length)
            state = self._sampler.state
            counter = state[1]
            failed = self._k.sample_slices(n, self._writer.cursor, self.num_envs, self.capacity,
                                           state, ep.episode, policy == "reject", _MAX_DRAWS, idx,
                                           x["mask"].reshape(batch_size, length))
            if failed >= 0:
                state[1] = counter  # a refused sample consumes no randomness
                raise ValueError(f"policy='reject': {_MAX_DRAWS} random starts found no slice of "
                                 f"{length} steps within one episode; episodes held are shorter "
                                 f"than that (use policy='mask')")
            ring.next = (i + 1) % len(ring.slots)
            self._storage.gather(slot.indices, slot)
            if self._elide_pairs:
                self._read_elided(slot.indices, x)
            if self._spill is not None:
                self._spill.after_sample()
        batch = ring.batches[i]
        if _getrefcount(batch) > _UNHELD:  # see sample()
            batch = ring.batches[i] = batch._retire()
        return batch.copy() if copy else batch

    def _check_slices(self, batch_size: int, length: int, reject: bool, n: int) -> None:
        """Refuse slice sizes the rows ``n`` held cannot back (before anything is allocated)."""
        if n == 0:
            raise ValueError("cannot sample from an empty buffer")
        if batch_size > n:
            raise ValueError(f"batch_size {batch_size} is larger than the {n} rows held; slices "
                             f"start at rows drawn with replacement but need batch_size <= len(buffer)")
        steps = self.capacity // self.num_envs
        if length > steps:
            raise ValueError(f"length {length} is longer than any slice can be: the buffer keeps "
                             f"at most {steps} steps per stream (capacity {self.capacity}, num_envs "
                             f"{self.num_envs})")
        steps = n // self.num_envs
        if reject and length > steps:
            raise ValueError(f"no slice of length {length} exists: the buffer holds {steps} "
                             f"steps per stream")

    def _gather(self, ring: _OutputRing, i: int, n: int) -> None:
        """Fill slot ``i`` of ``ring`` with a sample of the ``n`` valid rows (lock held)."""
        slot = ring.slots[i]
        self._sample_kernel(self._kernel_store, n, self._sampler.state, slot.indices,
                            slot.kernel_out)

    def _new_ring(self, batch_size, length: int | None = None) -> _OutputRing:
        batch_size = _check_int("batch_size", batch_size, 1)
        rings = getattr(self._local, "rings", None)
        if rings is None:
            rings = self._local.rings = {}
        key = batch_size if length is None else ("seq", batch_size, length)
        if self.memory_budget is not None:  # refuse before allocating the ring
            parts = self.nbytes_parts
            parts["new output ring"] = self._ring_size * self._planned_ring(batch_size, length)
            self._check_budget(parts, f"sampling batches of {batch_size}"
                               + (f" slices of {length} rows" if length else " rows"))
        ring = rings[key] = _OutputRing(self, batch_size, self._ring_size, length)
        self._rings.add(ring)
        return ring

    def _too_few_rows(self, batch_size: int, n: int) -> str:
        if n == 0:
            return "cannot sample from an empty buffer"
        return (f"batch_size {batch_size} is larger than the {n} rows held; sampling is with "
                f"replacement but needs batch_size <= len(buffer)")

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue exactly: spec, writer, sampler and a copy of the rows.

        The rows are layout-neutral (one array per field, ``(len(self), *shape)`` in slot order),
        so a state saved from one layout loads into the other. Plain Python and numpy objects
        only: no pickle is needed to store it.
        """
        with self._lock:
            return self._state_unlocked()

    def _state_unlocked(self, copy: bool = True) -> dict:
        # copy=False: views of the live arrays, for a checkpoint written under the lock
        size = self._writer.size
        state = {
            "format": _STATE_FORMAT,
            "version": _STATE_VERSION,
            "spec": self.spec.to_dict(),
            "capacity": self.capacity,
            "layout": self.layout,
            "writer": self._writer.state_dict(),
            "sampler": self._sampler.state_dict(),
            "data": self._storage.state_dict(size, copy),
            "num_envs": self.num_envs,
            "episodes": None if self._episodes is None else self._episodes.state_dict(size, copy),
        }
        state.update(self._extra_state(copy))
        return state

    def _extra_state(self, copy: bool) -> dict:
        """What a subclass adds to the state dict."""
        return {}

    def _config(self) -> dict:
        """The constructor's keyword arguments that rebuild this buffer (for checkpoints)."""
        return {"capacity": self.capacity, "layout": self.layout, "ring_size": self._ring_size,
                "num_envs": self.num_envs, "n_step": self.n_step, "gamma": self.gamma,
                "next_of": dict(self.next_of), "elide_next": self.elide_next, "roles": dict(self._roles)}

    def save(self, path, *, overwrite: bool = False) -> None:
        """Write a checkpoint directory: rows, cursor, RNG state, episode bookkeeping, config.

        The rows go straight from the storage to the file (no second copy in memory), and the
        checkpoint appears at ``path`` atomically (written beside it, then renamed). Readable
        without tfdata: ``state.json``, ``arrays/*.npy`` and the rows as a dataset file (see
        :mod:`tfdata.checkpoint`). Holds the buffer's lock while writing.

        ``overwrite``: an existing ``path`` is refused (``FileExistsError``) unless this is True
        and ``path`` is a tfdata checkpoint; nothing else is ever replaced or deleted.
        """
        from .checkpoint import save

        save(self, path, overwrite=overwrite)

    @classmethod
    def load(cls, path, **spill) -> "ReplayBuffer":
        """Rebuild a buffer saved with :meth:`save`; it continues exactly where it stopped.

        ``ReplayBuffer.load`` returns whichever buffer class was saved (``ReplayBuffer`` or
        ``PrioritizedReplayBuffer``); ``PrioritizedReplayBuffer.load`` insists on that class.
        ``spill_path=`` with ``hot_rows=`` or ``hot_bytes=`` rebuilds it as a spilling buffer
        (a checkpoint does not record where, or whether, a buffer spilled).
        """
        from .checkpoint import load

        buf = load(path, **spill)
        if not isinstance(buf, cls):
            raise TypeError(f"{path}: holds a {type(buf).__name__}, not a {cls.__name__}")
        return buf

    def load_state_dict(self, state: Mapping, _release=None, _records=None) -> None:
        """Restore a :meth:`state_dict`; validated in full first, so a bad state changes nothing."""
        if not isinstance(state, Mapping) or state.get("format") != _STATE_FORMAT:
            raise ValueError(f"not a {_STATE_FORMAT} state dict")
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported state version {state.get('version')!r} "
                             f"(this tfdata reads version {_STATE_VERSION})")
        spec = Spec.from_dict(state["spec"])
        if spec != self.spec:
            raise SpecError(f"state spec {spec} differs from this buffer's spec {self.spec}")
        if state["capacity"] != self.capacity:
            raise ValueError(f"state capacity {state['capacity']} differs from this buffer's "
                             f"capacity {self.capacity}")
        writer = RingWriter(self.capacity)
        writer.load_state_dict(state["writer"])
        sampler = UniformSampler(0)
        sampler.load_state_dict(state["sampler"])
        data = state["data"]
        size = writer.size
        if state.get("num_envs", 1) != self.num_envs:
            raise ValueError(f"state num_envs {state.get('num_envs')} differs from this buffer's "
                             f"{self.num_envs}")
        if size % self.num_envs:
            raise ValueError(f"writer state: size {size} is not a multiple of num_envs {self.num_envs}")
        episodes = None
        if self._episodes is not None:
            episodes = self._episodes.check_state(state.get("episodes"), size)
        for f in self._storage.spec:
            arr = data.get(f.name) if isinstance(data, Mapping) else None
            if not isinstance(arr, np.ndarray):
                raise SpecError(f"state data: field {f.name!r} missing or not an ndarray")
            if arr.shape != (size,) + f.shape or arr.dtype != f.dtype:
                raise SpecError(f"state data: field {f.name!r}: expected {f.dtype}{(size,) + f.shape}, "
                                f"got {arr.dtype}{arr.shape}")
        extra = self._check_extra_state(state, size)
        with self._lock:
            self._storage.load_state_dict(data, size, _release, _records)
            self._writer.load_state_dict(writer.state_dict())
            self._sampler.load_state_dict(sampler.state_dict())
            if episodes is not None:
                self._episodes.load_state(episodes, size)
            self._load_extra_state(extra)

    def _check_extra_state(self, state: Mapping, size: int):
        """Validate what a subclass adds to the state; return what ``_load_extra_state`` needs."""
        return None

    def _load_extra_state(self, extra) -> None:
        """Apply a subclass's validated extra state (called under the lock)."""
