"""Batches: what a sample returns, and the output rings that hold them without allocating.

:class:`Batch` is a read-only mapping of field name to array plus what the parts of a buffer add
(``indices``, ``weights``, ``versions``, ``discounts``, ``mask``). :class:`OutputRing` holds
``ring_size`` preallocated batches of one shape; the storage gives the rows of each, and every
other part (sampler, transforms) the per-batch arrays it declares through ``ring_arrays``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import numpy as np

from .errors import StaleBatchError

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
    write_position : int or None
        The buffer's write position when the batch was sampled (batches of
        :meth:`ReplayBuffer.sample`; see :attr:`tfdata.replay.writers.RingWriter.position`):
        lets ``update_field(name, batch, values)`` refuse rows overwritten since the sample.

    Notes
    -----
    A field has its spec's dtype and shape unless a transform of the buffer changed it
    (``transforms=``, :mod:`tfdata.transforms`): ``Normalize`` shows its field as float32,
    ``Cast`` as the dtype it names; shapes never change.

    Arrays returned by ``sample(copy=False)`` are views into the buffer's output ring. They stay
    valid until the same thread has called ``sample`` with the same batch size (and the same
    ``fields``: a projection has its own ring) ``ring_size`` more times; after that the same
    memory holds a newer batch. Each thread has its own ring.
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

    __slots__ = ("_fields", "indices", "weights", "versions", "discounts", "mask", "write_position")

    def __init__(self, fields, indices, weights=None, versions=None, discounts=None, mask=None,
                 write_position=None):
        self._fields = dict(fields)
        self.indices = indices
        self.weights = weights
        self.versions = versions
        self.discounts = discounts
        self.mask = mask
        self.write_position = write_position

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
                     dup(self.weights), dup(self.versions), dup(self.discounts), dup(self.mask),
                     self.write_position)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k!r}: {v.dtype}{list(v.shape)}" for k, v in self._fields.items())
        return f"Batch({{{inner}}}, indices=int64{list(self.indices.shape)})"


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
    return getrefcount(batch)


def retire(batch: Batch) -> Batch:
    """Make ``batch`` stale and return a fresh batch over the same arrays (for an output ring
    whose slot is about to be reused while ``batch`` is still held somewhere)."""
    cls = type(batch)
    fresh = object.__new__(cls)
    for name in _slot_names(cls):
        try:
            setattr(fresh, name, getattr(batch, name))
        except AttributeError:  # a slot never set
            pass
    batch.__class__ = _stale_class(cls)
    return fresh


getrefcount = sys.getrefcount
UNHELD = _unheld_refcount()


class OutputRing:
    """``ring_size`` preallocated outputs for one batch shape, handed out in turn.

    ``length`` None: batches of ``batch_size`` rows. ``length`` L: ``batch_size`` slices of L rows,
    gathered as ``batch_size * L`` rows and shown as ``(batch_size, L, ...)`` views.

    Parameters
    ----------
    storage
        Gives each slot's rows through ``new_output(rows)``: a storage, or a projection of one
        (:class:`tfdata.storage.Projection`) for batches of some fields.
    parts : sequence
        The sampler, then the transforms. Each has ``ring_arrays(batch_size, length, out)``: a dict
        of the arrays it needs per batch (ndarray values are owned and counted in
        :attr:`nbytes`; anything else, such as views of them, is not), and
        ``batch_view(arrays, fields, attrs)``, which adds what it shows in a batch: fields (the
        elided next fields) and attributes (``weights``, ``versions``, ``discounts``, ``mask``).
    names : sequence of str
        The batch's fields, in order.

    Attributes
    ----------
    slots : list of Output
        The storage outputs, one per ring slot.
    transforms : tuple
        ``parts[1:]``: the transforms to apply to this ring's batches, in order.
    arrays : list of list of dict
        ``arrays[i][k]``: part ``k``'s arrays of slot ``i``.
    batches : list of Batch
        The batch each slot is shown as.
    nbytes : int
        Bytes of the arrays this ring owns.
    """

    __slots__ = ("slots", "arrays", "batches", "next", "nbytes", "transforms", "__weakref__")

    def __init__(self, storage, batch_size: int, ring_size: int, length: int | None, parts, names):
        self.transforms = tuple(parts[1:])
        rows = batch_size * (length or 1)
        self.slots = [storage.new_output(rows) for _ in range(ring_size)]
        self.arrays = [[p.ring_arrays(batch_size, length, o) for p in parts] for o in self.slots]
        self.batches = []
        nbytes = 0
        for o, per_part in zip(self.slots, self.arrays):
            fields, attrs = dict(o.fields), {}
            for p, arrays in zip(parts, per_part):
                p.batch_view(arrays, fields, attrs)
                nbytes += sum(a.nbytes for a in arrays.values() if isinstance(a, np.ndarray))
            fields = {name: fields[name] for name in names}  # in spec order
            if length is None:
                self.batches.append(Batch(fields, o.indices, **attrs))
            else:
                shaped = {k: v.reshape((batch_size, length) + v.shape[1:]) for k, v in fields.items()}
                self.batches.append(Batch(shaped, o.indices.reshape(batch_size, length), **attrs))
            nbytes += o.nbytes
        self.next = 0
        self.nbytes = int(nbytes)
