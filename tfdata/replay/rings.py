"""A replay buffer's output rings: the preallocated batches of each thread, by batch shape.

Output rings are per thread: a thread's batch stays valid until that same thread has sampled
``ring_size`` more times, whatever other threads do. :class:`Rings` finds or builds the ring of
a batch shape (``batch_size``, slices of ``length``, a projection to some ``fields``) in this
thread's table, after the memory budget agrees; the sample path looks its ring up in the same
table first, with no call.
"""

from __future__ import annotations

import threading

from .._checks import check_int
from ..batch import OutputRing


def fields_key(fields):
    """``fields`` as a tuple to find a ring by (not checked); None when it cannot be one (a
    string, something not iterable): such a key finds no ring, and the check then names the
    problem."""
    if type(fields) is tuple:
        return fields
    if isinstance(fields, (str, bytes)):
        return None
    try:
        return tuple(fields)
    except TypeError:
        return None


class Rings:
    """The output rings of every thread of one buffer (one process or shared).

    Parameters
    ----------
    spec : Spec
        The fields a batch has.
    stored : Spec
        The fields the storage holds (a next field elided or rebuilt from frames is not one).
    stacked : tuple of str
        The stacked fields (frame stacks rebuild them: never gathered from the storage).
    ring_size : int
        Batches per ring.
    storage, sampler, transforms, lock
        The buffer's parts (``transforms``: the list a sample applies, in order).
    memory
        ``rings`` (a set the new rings are added to) and ``check_ring(batch_size, length,
        fields, lock)``, which refuses a ring the memory budget has no room for.
    slice_parts : list, optional
        The parts after the sampler of a ring of slices (default: ``transforms``).
    reserve : callable, optional
        ``reserve(batch_size)``, called under ``lock`` before a ring is built: room in the
        draws' scratch for a batch of that size.

    Attributes
    ----------
    local : threading.local
        ``local.rings``: this thread's ``{key: OutputRing}`` (absent before its first sample).
    """

    def __init__(self, spec, stored, stacked, ring_size: int, storage, sampler, transforms, lock,
                 memory, slice_parts=None, reserve=None):
        self.spec, self.stored, self.stacked, self.ring_size = spec, stored, stacked, ring_size
        self.storage, self.sampler, self.transforms = storage, sampler, transforms
        self.lock, self.memory, self.slice_parts, self.reserve = lock, memory, slice_parts, reserve
        self.local = threading.local()

    def fields(self, fields, as_tuple=None) -> tuple:
        """``fields`` checked (SpecError naming the problem), in spec order; ``as_tuple``: the
        same fields already made a tuple (a generator can be read only once), None if they
        could not be."""
        if not self.sampler.projects:
            raise NotImplementedError(f"fields=: {type(self.sampler).__name__} does not gather "
                                      f"projected outputs (its 'projects' is False: see "
                                      f"tfdata.replay.samplers)")
        return self.spec.select(fields if as_tuple is None else as_tuple)

    def new(self, batch_size, length: int | None = None, fields=None, key=None) -> OutputRing:
        """The output ring of this thread for ``batch_size`` rows (``length``: slices), of every
        field or of ``fields`` (checked, in spec order); also found under ``key`` from now on."""
        batch_size = check_int("batch_size", batch_size, 1)
        rings = getattr(self.local, "rings", None)
        if rings is None:
            rings = self.local.rings = {}
        own = batch_size if length is None else ("seq", batch_size, length)
        if fields is not None:
            own = (batch_size, fields) if length is None else own + (fields,)
            ring = rings.get(own)  # the same fields, asked for in another order or container
            if ring is not None:
                if key is not None:
                    rings[key] = ring
                return ring
        self.memory.check_ring(batch_size, length, fields, self.lock)  # before allocating it
        if fields is None and not self.stacked:
            source, transforms, names = self.storage, self.transforms, self.spec.names
        else:
            # the stored fields through a projection of the storage (never a stacked field's
            # frames: FrameStack rebuilds its stacks); elided ones by ElideNext
            names = self.spec.names if fields is None else fields
            source = self.storage.project([n for n in names if n in self.stored
                                           and n not in self.stacked])
            transforms = (self.transforms if fields is None
                          else [t.project(fields) for t in self.transforms])
        if length is not None and self.slice_parts is not None:
            transforms = (self.slice_parts if fields is None
                          else [t.project(fields) for t in self.slice_parts])
        if self.reserve is not None:
            with self.lock:  # a sample in another thread reads the scratch it replaces
                self.reserve(batch_size)
        ring = rings[own] = OutputRing(source, batch_size, self.ring_size, length,
                                       [self.sampler, *transforms], names)
        if key is not None:
            rings[key] = ring
        self.memory.rings.add(ring)
        return ring
