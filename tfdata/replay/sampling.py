"""The sample path of every replay buffer, one process or shared: written once.

:class:`Sampling` is ``sample`` and ``sample_sequences`` over a buffer's parts: this thread's
output rings (:class:`~tfdata.replay.rings.Rings`), the gate (:mod:`tfdata.replay.gates`, or a
shared buffer's :mod:`tfdata.shared.gate`), the streams, which draw (the contract of
:mod:`tfdata.replay.streams`: :class:`~tfdata.replay.streams.RingStreams` over a ring,
:class:`~tfdata.shared.streams.ShardStreams` over the shards of a region) and the slices
(:class:`~tfdata.replay.slices.Slices`). A buffer class sets those parts (``_local``,
``_ringset``, ``_gate``, ``_draw`` and ``_draw_call``: its streams' ``draw`` and
``draw_call``, ``_slices``, ``_lock``); the path
has no branch on which features are on: the gate waits and counts, the streams know where the
rows are, the transforms are a list.
"""

from __future__ import annotations

from .._checks import check_int
from ..batch import UNHELD, getrefcount, retire
from .rings import fields_key

__all__ = ["Sampling"]


class Sampling:
    """``sample`` and ``sample_sequences`` over the parts a buffer class sets (see the module)."""

    __slots__ = ()

    def sample(self, batch_size: int, *, copy: bool = False, fields=None):
        """Draw ``batch_size`` rows (see the buffer class for the rule).

        Parameters
        ----------
        batch_size : int
            ``1 <= batch_size <= len(self)``. With a rate limiter, or a sampler that waits for
            rows (``sampler="exactly_k"`` with a ``timeout``), ``batch_size <= capacity``: the
            call waits (the lock released) for the rows, up to that timeout, from the first call
            on, an empty buffer included.
        copy : bool, default False
            False returns views into this thread's output ring (valid until this thread has
            sampled ``ring_size`` more batches of this size and fields; a batch still held then
            is retired, see :class:`Batch`); True returns arrays that are the caller's to keep.
        fields : list of str, optional
            Gather only these fields (field projection): the batch is the one ``sample`` would
            have returned without ``fields`` (same slots, same random numbers used, same
            weights, versions and discounts), restricted to them, and only their bytes are
            copied. Their arrays are C-contiguous whatever the layout, except the fields of a
            group of a grouping held whole: one record block, copied whole, whose fields are
            strided views as in the full batch. n-step and elided next
            fields are computed as in full batches, reading from storage what the projection
            leaves out. None (the default): every field.

        Raises
        ------
        ValueError
            ``batch_size`` larger than ``len(self)`` (than the capacity, for a call that waits
            for rows): checked before the output ring of a new batch size is allocated, so a
            refused call takes no memory. The message says how the sampler takes rows (its
            ``rule``: with replacement, without, exactly-k).
        TimeoutError
            A call that waits for rows (see ``batch_size``) waited out its timeout; nothing
            was drawn or changed.
        SpecError
            ``fields`` names an unknown field (the message names it), a field twice, a
            non-str, or nothing; checked before anything is allocated or drawn.
        NotImplementedError
            ``fields`` with a sampler that does not gather projections (its ``projects`` is
            False).

        Returns
        -------
        Batch
            ``batch[name]`` has dtype ``spec[name].dtype`` (unless a transform changes it:
            ``Normalize`` gives float32, ``Cast`` its dtype) and shape
            ``(batch_size, *spec[name].shape)``; ``batch.indices`` (int64, ``(batch_size,)``)
            holds the storage slots. A prioritized buffer also sets ``batch.weights`` (float32
            importance weights, at most 1) and ``batch.versions``.
        """
        if type(batch_size) is not int:  # 2.0 or True would find the ring of 2 or 1
            batch_size = check_int("batch_size", batch_size, 1)
        if fields is None:
            key = batch_size
        else:  # a list or tuple inline, without a call of fields_key
            t = type(fields)
            key = (batch_size, fields if t is tuple else tuple(fields) if t is list else fields_key(fields))
        try:
            ring = self._local.rings[key]
        except (AttributeError, KeyError, TypeError):
            names = None if fields is None else self._ringset.fields(fields, key[1])
            self._gate.admit(batch_size)  # check, then allocate: a refused sample builds no ring
            ring = self._ringset.new(batch_size, fields=names, key=key)
        gate = self._gate
        # returns holding the lock: the rows held, again (a clear() may have run since); a
        # limiter counts the batch
        n = gate.acquire(batch_size)
        try:
            i = ring.next
            position = self._draw(n, ring.slots[i], ring.arrays[i], ring.transforms)
            ring.next = (i + 1) % len(ring.slots)  # a draw that raised took no slot
        except BaseException:
            gate.undo(batch_size)  # nothing was drawn
            raise
        finally:
            self._lock.release()
        batch = ring.batches[i]
        if getrefcount(batch) > UNHELD:  # the slot's previous batch is still held: retire it
            batch = ring.batches[i] = retire(batch)
        batch.write_position = position  # what update_field(name, batch, ...) checks rows by
        return batch.copy() if copy else batch

    def check_sample_into(self) -> None:
        """Refuse (NotImplementedError, naming why) a buffer whose rows :meth:`sample_into`
        cannot draw: one whose sample applies transforms (n-step, elided next fields, frame
        stacks, spilling, transforms on sample) or whose sampler does not gather through its
        output (``projects``)."""
        if self._ringset.transforms:
            raise NotImplementedError(f"{type(self).__name__}: its samples apply transforms "
                                      f"(n_step, elide_next, frame_stack, spill_path or "
                                      f"transforms=), which sample_into does not run")
        if not self.sampler.projects:
            raise NotImplementedError(f"{type(self).__name__}: its sampler "
                                      f"{type(self.sampler).__name__} does not gather through "
                                      f"its output (its 'projects' is False)")

    def sample_into(self, out, arrays: dict) -> int:
        """Draw ``len(out.indices)`` rows with this buffer's sampler into ``out``, as
        :meth:`sample` draws a batch: one lock, one sampler call, the rows held checked first.

        The contract through which a :class:`~tfdata.MixedReplayBuffer` fills the rows of a
        batch that come from this buffer (call :meth:`check_sample_into` once first).

        Parameters
        ----------
        out : tfdata.storage.Output
            An output of a projection of this buffer's storage (``storage.project(names)`` or
            a :class:`~tfdata.storage.Projection` over ``storage.byte_bases()`` and
            ``storage.spans()``), or one whose ``indices`` (int64, ``(k,)``) and ``kernel_out``
            are views of rows ``[a, a + k)`` of a larger output of one, or
            ``storage.window(big, a, k)`` of an output ``big`` of the storage's
            ``row_format()``: the rows are written there, and nowhere else.
        arrays : dict
            The sampler's per-batch arrays for ``k`` rows (``sampler.ring_arrays(k, None,
            out)``; an array may be replaced by a view of the same dtype and shape, e.g. into a
            larger batch's ``weights``).

        Returns
        -------
        int
            The write position at the draw (``laps * capacity + cursor``).

        Raises
        ------
        ValueError
            ``k`` larger than the rows held: nothing was drawn.
        """
        k = out.indices.shape[0]
        n = self._gate.acquire(k)
        try:
            return self._draw(n, out, (arrays,), ())
        except BaseException:
            self._gate.undo(k)
            raise
        finally:
            self._lock.release()

    def sample_into_call(self, out, arrays: dict):
        """:meth:`sample_into` of ``out`` and ``arrays`` bound once: a callable of no arguments
        that draws as :meth:`sample_into` does (the same lock, gate, rows and random numbers)
        and returns nothing. What a :class:`~tfdata.MixedReplayBuffer` calls for every batch:
        the sampler's kernel is found once, here, not per call.

        ``out`` and ``arrays`` as for :meth:`sample_into`; ``arrays`` must hold the arrays the
        sampler will use from now on (a sampler may bind them).
        """
        k = out.indices.shape[0]
        run = self._draw_call(out, arrays)
        acquire, undo, release = self._gate.acquire, self._gate.undo, self._lock.release

        def call():
            n = acquire(k)
            try:
                run(n)
            except BaseException:
                undo(k)
                raise
            finally:
                release()

        return call

    def sample_sequences(self, batch_size: int, length: int, *, policy: str = "mask",
                         copy: bool = False, fields=None):
        """Draw ``batch_size`` slices of ``length`` consecutive steps of one stream and episode.

        Parameters
        ----------
        batch_size, length : int
            ``1 <= batch_size <= len(self)`` (start rows are drawn by the sampler, as in
            :meth:`sample`; with a rate limiter the call waits for the rows, up to its timeout,
            from the first call on); ``1 <= length <= capacity // num_envs`` (no slice is
            longer than a stream can hold). Both are checked before any output is allocated.
        policy : {"mask", "reject"}
            What to do with a slice that would run past its episode's end (or past the newest
            row): ``"mask"`` keeps it, repeats its last valid row in the remaining positions and
            marks them False in ``batch.mask``; ``"reject"`` redraws the start until the whole
            slice lies in one episode (each check O(1)), and raises ValueError if no slice can
            be found (episodes shorter than ``length``).
        copy : bool
            As in :meth:`sample`.
        fields : list of str, optional
            As in :meth:`sample`: only these fields, the slices of a full call restricted to
            them.

        Returns
        -------
        Batch
            ``batch[name]`` has shape ``(batch_size, length, *spec[name].shape)``,
            ``batch.indices`` int64 ``(batch_size, length)``, ``batch.mask`` bool
            ``(batch_size, length)``. Start rows are drawn by the sampler: uniformly over the
            rows held (over the valid starts with ``"reject"``), or by a prioritized buffer in
            proportion to the start row's priority, with ``batch.weights`` and
            ``batch.versions`` of shape ``(batch_size,)`` for the start rows. Rows are the stored
            rows: no n-step processing.
        """
        return self._slices.sample(batch_size, length, policy, copy, fields)
