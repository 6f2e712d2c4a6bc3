"""The uniform replay buffer: a spec, a storage, a ring writer and a sampler behind one lock."""

from __future__ import annotations

import numbers
import threading
from collections.abc import Mapping

import numpy as np

from ._fastpath import make_push
from .errors import SpecError
from .sampler import UniformSampler
from .spec import Spec
from .storage import Output, make_storage
from .writer import RingWriter

_STATE_FORMAT = "tfdata.ReplayBuffer"
_STATE_VERSION = 1
# Lemire's multiply-shift draws from the top 32 bits of each random word
MAX_CAPACITY = (1 << 32) - 1


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

    Notes
    -----
    Arrays returned by ``sample(copy=False)`` are views into the buffer's output ring. They stay
    valid until the same thread has called ``sample`` with the same batch size ``ring_size`` more
    times; after that the same memory holds a newer batch. Each thread has its own ring.
    Keep a batch longer with ``sample(copy=True)`` or :meth:`copy`. The mapping itself is
    read-only (it is reused by the ring); ``dict(batch)`` gives a mutable one.
    """

    __slots__ = ("_fields", "indices", "weights", "versions")

    def __init__(self, fields, indices, weights=None, versions=None):
        self._fields = dict(fields)
        self.indices = indices
        self.weights = weights
        self.versions = versions

    def __getitem__(self, name):
        return self._fields[name]

    def __iter__(self):
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def copy(self) -> "Batch":
        """A deep copy with C-contiguous arrays, valid forever."""
        weights = None if self.weights is None else self.weights.copy()
        versions = None if self.versions is None else self.versions.copy()
        return Batch({k: np.array(v, order="C") for k, v in self._fields.items()}, self.indices.copy(),
                     weights, versions)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k!r}: {v.dtype}{list(v.shape)}" for k, v in self._fields.items())
        return f"Batch({{{inner}}}, indices=int64[{len(self.indices)}])"


class _OutputRing:
    """``ring_size`` preallocated outputs for one batch size, handed out in turn."""

    __slots__ = ("slots", "batches", "next", "weights", "scratch", "versions")

    def __init__(self, storage, batch_size: int, ring_size: int, weighted: bool = False):
        self.slots: list[Output] = [storage.new_output(batch_size) for _ in range(ring_size)]
        # per slot: importance weights (float32) and float64 scratch, for weighted samplers
        self.weights = [np.zeros(batch_size, np.float32) if weighted else None for _ in self.slots]
        self.scratch = [np.zeros(batch_size, np.float64) if weighted else None for _ in self.slots]
        self.versions = [np.zeros(batch_size, np.uint64) if weighted else None for _ in self.slots]
        self.batches = [Batch(o.fields, o.indices, w, v)
                        for o, w, v in zip(self.slots, self.weights, self.versions)]
        self.next = 0


def _check_int(name: str, value, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


class ReplayBuffer:
    _weighted = False  # whether sampled batches carry importance weights
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
    """

    def __init__(self, spec, capacity: int, *, layout: str | None = None, seed: int | None = None,
                 ring_size: int = 2):
        self.spec = spec if isinstance(spec, Spec) else Spec(spec)
        capacity = _check_int("capacity", capacity, 1, MAX_CAPACITY)
        self._ring_size = _check_int("ring_size", ring_size, 1)
        self._storage = make_storage(self.spec, capacity, layout)
        self._writer = RingWriter(capacity)
        self._sampler = UniformSampler(seed)
        self._lock = threading.Lock()
        # output rings are per thread: a thread's batch stays valid until that same thread has
        # sampled ring_size more times, whatever other threads do
        self._local = threading.local()
        # bound once: the sample path does no attribute lookups through the storage
        self._sample_kernel = self._storage.kernels.sample_uniform
        self._kernel_store = self._storage.kernel_store
        self._fast_push = make_push(self.spec, self._storage.field_views(), self._writer,
                                    self._lock, self._checked_push)

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

    @property
    def nbytes(self) -> int:
        """Bytes of row storage (output rings not included)."""
        return self._storage.nbytes

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
        values = self.spec.check_row(row)
        with self._lock:
            w = self._writer
            self._storage.write_row(w.cursor, values)
            w.advance(1)

    def extend(self, batch: Mapping) -> None:
        """Append ``n`` rows given as one array per field, each with leading dimension ``n``.

        The step of a gymnasium vector env (``num_envs`` rows) fits as is. When ``n`` exceeds the
        capacity, the result is that of ``n`` pushes: the last ``capacity`` rows remain.

        Raises
        ------
        SpecError
            As :meth:`push`, and when fields disagree on ``n``. The buffer is unchanged.
        """
        n, values = self.spec.check_batch(batch)
        if n == 0:
            return
        with self._lock:
            w = self._writer
            if n <= w.capacity - w.cursor:  # no wrap: one span
                self._storage.write_rows(w.cursor, values, 0, n)
            else:
                for dst, src, count in w.spans(n):
                    self._storage.write_rows(dst, values, src, count)
            w.advance(n)

    def clear(self, *, wipe: bool = False) -> None:
        """Forget every row. ``wipe=True`` also overwrites the storage with zeros."""
        with self._lock:
            self._writer.reset()
            if wipe:
                self._storage.wipe()
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
            sampled ``ring_size`` more batches of this size); True returns arrays that are the
            caller's to keep.

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
            ring = self._new_ring(batch_size)
        with self._lock:
            n = self._writer.size
            if batch_size > n:
                raise ValueError(self._too_few_rows(batch_size, n))
            i = ring.next
            ring.next = (i + 1) % len(ring.slots)
            self._gather(ring, i, n)
        batch = ring.batches[i]
        return batch.copy() if copy else batch

    def _gather(self, ring: _OutputRing, i: int, n: int) -> None:
        """Fill slot ``i`` of ``ring`` with a sample of the ``n`` valid rows (lock held)."""
        slot = ring.slots[i]
        self._sample_kernel(self._kernel_store, n, self._sampler.state, slot.indices,
                            slot.kernel_out)

    def _new_ring(self, batch_size) -> _OutputRing:
        batch_size = _check_int("batch_size", batch_size, 1)
        rings = getattr(self._local, "rings", None)
        if rings is None:
            rings = self._local.rings = {}
        ring = rings[batch_size] = _OutputRing(self._storage, batch_size, self._ring_size,
                                               self._weighted)
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

    def _state_unlocked(self) -> dict:
        return {
            "format": _STATE_FORMAT,
            "version": _STATE_VERSION,
            "spec": self.spec.to_dict(),
            "capacity": self.capacity,
            "layout": self.layout,
            "writer": self._writer.state_dict(),
            "sampler": self._sampler.state_dict(),
            "data": self._storage.state_dict(self._writer.size),
        }

    def load_state_dict(self, state: Mapping) -> None:
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
        for f in self.spec:
            arr = data.get(f.name) if isinstance(data, Mapping) else None
            if not isinstance(arr, np.ndarray):
                raise SpecError(f"state data: field {f.name!r} missing or not an ndarray")
            if arr.shape != (size,) + f.shape or arr.dtype != f.dtype:
                raise SpecError(f"state data: field {f.name!r}: expected {f.dtype}{(size,) + f.shape}, "
                                f"got {arr.dtype}{arr.shape}")
        extra = self._check_extra_state(state, size)
        with self._lock:
            self._storage.load_state_dict(data, size)
            self._writer.load_state_dict(writer.state_dict())
            self._sampler.load_state_dict(sampler.state_dict())
            self._load_extra_state(extra)

    def _check_extra_state(self, state: Mapping, size: int):
        """Validate what a subclass adds to the state; return what ``_load_extra_state`` needs."""
        return None

    def _load_extra_state(self, extra) -> None:
        """Apply a subclass's validated extra state (called under the lock)."""
