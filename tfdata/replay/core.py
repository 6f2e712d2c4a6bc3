"""The replay core: a spec, a storage, a writer, a sampler and transforms behind one lock.

:class:`ReplayCore` holds the parts and does what no part can do alone: validation of rows,
the lock, the per-thread output rings, the memory budget, and the sample path. Its options are
checked once by a :class:`~tfdata.replay.plan.Plan`, its parts built by
:func:`~tfdata.replay.build.build`; it knows no layout (the storage does), no sampling rule (the
sampler does), no write position (the writer does), no n-step or elision arithmetic (the
transforms do), no rate (the gate does). Column operations are
:class:`~tfdata.replay.fields.Fields`; the state dict is :mod:`tfdata.replay.state`.
:class:`tfdata.ReplayBuffer` and :class:`tfdata.PrioritizedReplayBuffer` are constructors that
pick the sampler; the parts' contracts are in :mod:`tfdata.replay.samplers`,
:mod:`tfdata.replay.writers` and :mod:`tfdata.replay.transforms`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from .._budget import parse_bytes
from . import planning, state as _state
from .budget import Memory
from .build import build, weak_method
from .fields import Fields, delegate
from .gates import LimiterGate, OpenGate
from .plan import CONFIG_DEFAULTS, MAX_CAPACITY, Plan, min_capacity
from .rings import Rings, fields_key
from .sampling import Sampling
from .slices import MAX_DRAWS, Slices
from .state import STATE_FORMAT, STATE_KEYS, STATE_VERSION
from .writes import Writes

__all__ = ["ReplayCore", "CONFIG_DEFAULTS", "MAX_CAPACITY", "MAX_DRAWS", "STATE_FORMAT",
           "STATE_KEYS", "STATE_VERSION", "fields_key", "weak_method"]


class ReplayCore(Sampling):
    """The parts and the lock; see :class:`tfdata.ReplayBuffer` for the public behaviour."""

    #: its checkpoint part (the contract: :mod:`tfdata.replay.checkpoint`)
    CHECKPOINT = _state.RingCheckpoint

    def __init__(self, spec, capacity: int, sampler, *, allocator=None, memory_budget=None,
                 rate_limiter=None, **options):
        from .. import alloc

        plan = self._planned = Plan(type(self).__name__, spec, capacity, sampler,
                                  rate_limiter=rate_limiter, **options)
        self.spec, self.sampler, self.num_envs = plan.spec, sampler, plan.num_envs
        self.n_step, self.gamma, self.next_of, self.elide_next = (plan.n_step, plan.gamma,
                                                                  plan.next_of, plan.elide_next)
        self.spill_path, self.hot_rows, self.compress_cold = (plan.spill_path, plan.hot_rows,
                                                              plan.compress_cold)
        if plan.compress_cold:
            from ..storage import cold

            cold.codec()  # ImportError naming the extra, before anything is allocated
        self.allocator = alloc.resolve(allocator)
        self.memory_budget = None if memory_budget is None else parse_bytes("memory_budget", memory_budget)
        memory = self._memory = Memory(type(self), plan, self.memory_budget)
        if self.memory_budget is not None:  # refuse before allocating anything
            memory.check_construction()
        # (weak: a part holding the memory's bound method would make a cycle through the parts)
        p = self._parts = build(plan, self.allocator,
                                None if self.memory_budget is None else weak_method(memory, "room"),
                                weak_method(memory, "grow"))
        memory.bind(p)
        self._storage, self._writer, self._lock = p.storage, p.writer, p.lock
        self._episodes, self._cold = p.episodes, p.cold
        self._fields = Fields(plan, p.storage, p.writer, p.lock, p.episodes, p.stats, p.spill)
        self._ringset = Rings(plan.spec, plan.stored, plan.stacked, plan.ring_size, p.storage, sampler,
                              p.transforms, p.lock, memory)
        self._local = self._ringset.local  # the sample path's lookup, with no call
        gates = {}
        self._gate = OpenGate(p.writer, sampler, p.lock)
        if rate_limiter is not None:
            gates = self._bind_limiter(rate_limiter)
            self._gate = LimiterGate(rate_limiter, p.writer, p.held, sampler, self.num_envs, p.lock)
        self._draw = p.streams.draw
        self._draw_call = p.streams.draw_call
        self._slices = Slices(sampler, p.streams, p.lock, self._gate, self._ringset,
                              p.writer.capacity, self.num_envs)
        writes = self._writes = Writes(self.spec, p)
        # the generic paths (tests compare the generated push and extend with them)
        self._checked_push, self._checked_extend = writes.push, writes.extend
        self._fast_push = self._writer.make_push(self.spec, self._lock, writes.push,
                                                 gate=gates.get("push"))
        if type(self).push is ReplayCore.push:
            # the generated push itself, not a method that calls it: one Python call less per
            # row; ReplayCore.push keeps the documentation
            self.push = self._fast_push
        if type(self).extend is ReplayCore.extend:  # the same for a vector env's step
            self.extend = self._writer.make_extend(self.spec, self._lock, writes.extend,
                                                   writes.values, gate=gates.get("extend"))

    def _bind_limiter(self, limiter) -> dict:
        """Take ``limiter`` (a :class:`~tfdata.replay.limiter.RateLimiter`, not another
        buffer's); the gates the generated push and extend call under the lock."""
        from .limiter import RateLimiter

        if not isinstance(limiter, RateLimiter):
            raise TypeError(f"rate_limiter must be a tfdata.RateLimiter or None, got "
                            f"{type(limiter).__name__} {limiter!r:.100}")
        limiter.bind(self._lock, self, self.capacity)
        self._parts.limiter = limiter
        return {"push": limiter.admit_insert, "extend": (limiter.insert_wait, limiter.inserted)}

    @property
    def rate_limiter(self):
        """The :class:`~tfdata.RateLimiter` given as ``rate_limiter=``, or None."""
        return self._parts.limiter

    @classmethod
    def min_capacity(cls, spec, **options) -> int:
        """The smallest capacity a buffer of these options can have: ``num_envs`` rows, or with
        ``frame_stack`` a stack of frames per stream (``max(K) * num_envs``). Checks nothing else."""
        return min_capacity(spec, **options)

    # -- memory -----------------------------------------------------------------------------
    @classmethod
    def plan_memory(cls, spec, capacity: int, *, batch_sizes=(), **options) -> dict:
        """The bytes a buffer built with these arguments would hold, by part, without building it.

        ``batch_sizes``: batch sizes to be sampled, each adding an output ring (a pair
        ``(batch_size, length)`` for :meth:`sample_sequences`; a triple ``(batch_size, length,
        fields)`` for batches of some fields, ``length`` None for :meth:`sample`). Returns the
        same keys as :attr:`nbytes_parts`. ``memory_budget=`` checks this plan before allocating.
        With ``compress_cold=True``, ``cold`` is a bound: the tables and the cache, and every frame
        that can be cold at its uncompressed size (the budget check at construction counts the
        tables and the cache; each compressed block is checked against the budget when it is made).
        """
        return cls._plan(spec, capacity, options, "plan_memory").parts(batch_sizes)

    @classmethod
    def _plan(cls, spec, capacity: int, options: dict, what: str) -> Plan:
        """The plan of a buffer of these arguments: checked, nothing allocated."""
        options = dict(options)
        sampler = cls._planned_sampler(options)
        for k in ("seed", "allocator", "memory_budget"):  # no effect on the bytes held
            options.pop(k, None)
        limiter = options.pop("rate_limiter", None)  # none either, but it combines or not
        bad = set(options) - set(CONFIG_DEFAULTS)
        if bad:
            raise TypeError(f"{what}: unexpected keyword(s) {sorted(bad)}; allowed: "
                            f"{sorted(CONFIG_DEFAULTS)}")
        return Plan(cls.__name__, spec, capacity, sampler, rate_limiter=limiter, **options)

    @classmethod
    def plan_storage(cls, spec, capacity: int, **options) -> dict:
        """What a buffer built with these arguments stores, without building it (a checkpoint
        checks its files against this): ``stored`` (the Spec of the stored fields: next fields
        elided or rebuilt left out, stacked fields one frame wide), ``layout`` (the storage's
        layout of them), ``episodes`` (``(spec, next_of, elide)`` of the episode bookkeeping, or
        None when none is kept) and ``frames`` (the resolved frame stacks, or None)."""
        return cls._plan(spec, capacity, options, "plan_storage").storage()

    @classmethod
    def _planned_sampler(cls, options: dict):
        """The (unbound) sampler a buffer built with ``options`` would have; pops its options."""
        raise NotImplementedError

    @property
    def nbytes_parts(self) -> dict:
        """Bytes this buffer holds in memory, by part (all ints).

        ``storage``: the rows (for a spilling buffer, the ``hot_rows`` kept resident; the file
        holds the rest). ``bookkeeping``: episode numbers, elided final values, slot versions.
        ``trees``: priority trees and the trees of running statistics (``stats=``).
        ``output_rings``: the preallocated batches of every thread and batch size sampled so far.
        ``cold`` (``compress_cold=True`` only): the compressed copies of cold frames, the cache
        they are decompressed into and the block tables.
        """
        return self._memory.parts

    @property
    def nbytes(self) -> int:
        """Total of :attr:`nbytes_parts`: every byte of memory this buffer allocated."""
        return sum(self._memory.parts.values())

    @property
    def cold_info(self) -> dict | None:
        """The compressed cold tier (``compress_cold=True``), per stacked field: ``codec``,
        ``block`` (slots per block), ``blocks`` (copies held), ``raw_bytes`` (their frames),
        ``compressed_bytes`` (the copies), ``ratio``, ``refused`` (blocks not kept: over the
        budget or incompressible), ``shed`` (copies dropped to make room in the budget for
        something the buffer needed), ``decompressed`` (blocks decompressed by samples); None
        without a cold tier."""
        if not self.compress_cold:
            return None
        with self._lock:
            return {name: c.info() for name, c in self._cold.items()}

    # -- introspection ----------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._writer.capacity

    @property
    def layout(self):
        """``"aos"``, ``"soa"`` or the grouping (a tuple of tuples of field names, normalised:
        ``layout=buffer.layout`` builds the same storage)."""
        return self._planned.layout

    @property
    def storage(self):
        """The storage object (``AoSStorage``, ``SoAStorage`` or ``GroupStorage``)."""
        return self._storage

    @property
    def writer(self):
        """The writer (:class:`tfdata.replay.writers.RingWriter`): ``cursor``, ``size``."""
        return self._writer

    @property
    def episodes(self):
        """The episode bookkeeping (:class:`tfdata.replay.episodes.Episodes`), or None."""
        return self._episodes

    @property
    def roles(self) -> dict:
        """Field names of the roles ``reward``, ``terminated``, ``truncated`` found in the spec."""
        return dict(self._planned.roles)

    @property
    def lock(self):
        """The buffer's lock (a ``threading.Lock``), which push, extend, sample and the state
        hold: held by a caller that makes checks and changes over several buffers as one
        (:meth:`tfdata.PrioritizedReplayBuffer.prepare_update`)."""
        return self._lock

    @property
    def ring_size(self) -> int:
        return self._planned.ring_size

    @property
    def transforms(self) -> tuple:
        """The transforms every sample applies, in order (``transforms=``, see
        :mod:`tfdata.transforms`)."""
        return self._planned.transforms

    @property
    def transform_parts(self) -> tuple:
        """The bound parts of :attr:`transforms` (what a state's ``transforms`` entry is
        checked by)."""
        return tuple(self._parts.sample_transforms)

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
        self._writes.extend(batch)

    def clear(self, *, wipe: bool = False) -> None:
        """Forget every row. ``wipe=True`` also overwrites the storage with zeros. A rate
        limiter's counts go back to 0 (its wait metrics stay): sampling waits for
        ``min_size_to_sample`` new rows, as after construction."""
        with self._lock:
            if self._parts.limiter is not None:
                self._parts.limiter.reset()
            if wipe:
                self._storage.wipe()
            self._writer.reset()  # and the write hooks: sampler, spill (releases the pages)
            if self._episodes is not None:
                self._episodes.clear(wipe)
            if self._parts.frame_stacks is not None:
                self._parts.frame_stacks.clear(wipe)
            if not self.sampler.hears_writes:
                self.sampler.on_clear()
    # -- columns (see tfdata.replay.fields) ---------------------------------------------------
    @property
    def stats_fields(self) -> tuple:
        """The fields whose running statistics this buffer keeps (``stats=`` at construction)."""
        return self._planned.stats_fields

    column = delegate("column")
    column_stats = delegate("column_stats")
    stats = delegate("stats")
    update_field = delegate("update_field")
    release_cold = delegate("release_cold")

    # -- state (see tfdata.replay.state) ------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue exactly: spec, writer, sampler and a copy of the rows
        (and, with ``stats=``, each field's statistics under ``"stats"``: count, and mean, var,
        min, max as float64 arrays of the field's shape; a load checks them against the rows).

        The rows are layout-neutral (one array per field, ``(len(self), *shape)`` in slot order),
        so a state saved from one layout loads into the other. Plain Python and numpy objects
        only: no pickle is needed to store it.
        """
        with self._lock:
            return _state.gather(self._parts, copy=True)

    @contextlib.contextmanager
    def snapshot(self):
        """Hold the lock and yield the state dict as views of the live arrays (what a checkpoint
        writes; valid only inside the ``with``)."""
        with self._lock:
            yield _state.gather(self._parts, copy=False)

    @property
    def config(self) -> dict:
        """The constructor's keyword arguments that rebuild this buffer (what a checkpoint keeps;
        ``stats`` only when statistics are kept, so a checkpoint without them is what it was
        before they existed)."""
        config = self._planned.config()
        if self._parts.limiter is not None:  # its parameters; the counts are in the state
            config["rate_limiter"] = self._parts.limiter.params()
        return config

    def save(self, path, *, overwrite: bool = False) -> None:
        """Write a checkpoint directory: rows, cursor, RNG state, episode bookkeeping, config.

        The rows go straight from the storage to the file (no second copy in memory), and the
        checkpoint appears at ``path`` atomically (written beside it, then renamed). Readable
        without tfdata: ``state.json``, ``arrays/*.npy`` and the rows as a dataset file (see
        :mod:`tfdata.replay.checkpoint`). Holds the buffer's lock while writing.

        ``overwrite``: an existing ``path`` is refused (``FileExistsError``) unless this is True
        and ``path`` is a tfdata checkpoint; nothing else is ever replaced or deleted.
        """
        from .checkpoint import save

        save(self, path, overwrite=overwrite)

    @classmethod
    def load(cls, path, *, samplers=(), transforms=(), **spill):
        """Rebuild a buffer saved with :meth:`save`; it continues exactly where it stopped.

        ``ReplayBuffer.load`` returns whichever buffer class was saved (``ReplayBuffer`` or
        ``PrioritizedReplayBuffer``); ``PrioritizedReplayBuffer.load`` insists on that class.
        ``samplers=[MySampler, ...]``: the sampler classes of yours a checkpoint may name
        besides tfdata's (an allow-list, by their ``name``: a checkpoint never makes tfdata
        import or call anything else); the one it names is rebuilt with its ``from_config``
        and its state checked by its ``check_state`` (see :mod:`tfdata.replay.samplers`).
        ``spill_path=`` with ``hot_rows=`` or ``hot_bytes=`` rebuilds it as a spilling buffer
        (a checkpoint does not record where, or whether, a buffer spilled); ``stats=`` keeps
        running statistics of other fields than the checkpoint's (computed from the rows: a
        checkpoint written before statistics existed can have them so);
        ``layout=`` rebuilds it in another layout (the same samples).
        ``transforms=[my_fn, ...]``: the functions of yours a checkpoint's ``Compiled`` and
        ``Function`` transforms may name (an allow-list, by import path ``module:qualname``; a
        path recorded in the checkpoint that is not among them is a FormatError naming it).
        """
        from .checkpoint import load

        # a checkpoint of another class is refused before anything is built
        return load(path, planning.buffer_classes(ReplayCore), want=cls, samplers=samplers,
                    transforms=transforms, **spill)

    def load_state_dict(self, state: Mapping, release=None, records=None) -> None:
        """Restore a :meth:`state_dict`; validated in full first, so a bad state changes nothing.

        Checked as a whole: the state's sampler part must be this buffer's sampler's (a state
        saved with another sampler is refused, naming both), and each part's state is checked
        against its own settings and against the other parts' (the writer's cursor and size, a
        frame stack's steps, an exactly-k pool's counts, a pass, a rate limiter's counts)
        before anything changes.

        ``release(start, stop)`` is called after each chunk of rows is copied (a mapped source
        drops its pages); ``records``: the same rows as one structured array, which an AoS
        storage of that dtype copies whole.
        """
        _state.restore(self._parts, state, release, records)
