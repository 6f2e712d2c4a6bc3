"""Batches mixed from several sources: :class:`MixedReplayBuffer`.

Each batch takes a fixed share of its rows from each source: a dataset (read-only rows, drawn
uniformly by a sampler this buffer owns) or a replay buffer (drawn by its own sampler, under its
own lock, through :meth:`~tfdata.ReplayBuffer.sample_into`). Every source gathers straight into
its rows of one output batch: one kernel call per source, no copy after. When every source holds
its rows in one row format (``row_format()``: a buffer of AoS records and a dataset written from
its spec, say), the batch is an output of that format and each source fills its rows with its
own kernels (``window``), as a uniform sample would; otherwise, and for ``fields=``, each
gathers through a projection into C-contiguous columns (:class:`~tfdata.storage.Projection`).
The design and what was rejected: docs/design/mixed.md.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from functools import partial

import numpy as np

from .._budget import parse_bytes
from .._checks import check_int
from .._rng import MASK64
from ..batch import UNHELD, Batch, getrefcount, retire
from ..errors import MemoryBudgetError, SpecError
from ..storage import Output, Projection
from . import mixed_files
from .core import ReplayCore
from .mixed_transforms import MixedTransforms
from .mixing import MixedBatch, check_fractions, check_shares, check_sources, refuse_short, split
from .prioritized import PrioritizedReplayBuffer
from .rings import fields_key
from .samplers import StateError, shown, state_int
from .samplers.uniform import UniformSampler

__all__ = ["MixedBatch", "MixedReplayBuffer", "split"]


class _Ring:
    """``ring_size`` mixed batches of one shape, each with the draws that fill it."""

    __slots__ = ("draws", "batches", "next", "nbytes", "need", "shares", "keep", "__weakref__")


class MixedReplayBuffer:
    """Batches drawn from several sources in fixed proportions (offline-to-online RL: RLPD's
    half from a dataset, half from the online buffer).

    Parameters
    ----------
    sources : mapping of str to source
        In batch order. A source is an :class:`~tfdata.ArrayDataset` or
        :class:`~tfdata.MmapDataset` (any layout; read-only rows drawn uniformly with
        replacement by a sampler of this buffer), or a :class:`~tfdata.ReplayBuffer` or
        :class:`~tfdata.PrioritizedReplayBuffer` (its own sampler, lock and writes: keep
        pushing to it; no n-step, elided next fields, frame stacks, spilling or
        ``transforms``). Every source has the same fields, dtypes and shapes; layouts may
        differ. At most 255 sources; names
        are plain words (letters, digits, ``_ . -``).
    fractions : mapping of str to float, optional
        Each source's share, positive, summing to 1 (within 1e-6); default equal shares. The
        rows of a batch per source: :func:`split` (largest remainder).
    seed : int, optional
        Dataset source ``i`` (``i`` its number among all sources) is drawn by a uniform
        sampler seeded ``(seed + i) mod 2**64`` (the counter RNG of every tfdata sampler); None
        draws a seed from the OS (recorded in :meth:`state_dict`).
    ring_size : int, default 2
        Batches per output ring (see :meth:`sample`).
    allocator, memory_budget
        Where the output rings (and the statistics of ``stats_from``) come from; bytes they may
        take (checked before each ring).
    transforms : list of tfdata.transforms objects, optional
        Applied to every batch, in order, after every source has gathered its rows, under this
        buffer's lock (see :mod:`tfdata.transforms`): the same descriptions, parts and rules
        as ``ReplayBuffer(transforms=)`` (their output arrays are held by the output rings;
        ``fields=`` projections as there). A source's own ``transforms=`` is refused.
    roles : dict, optional
        ``{role: field}`` for the transforms that read a role (``reward``: ScaleReward,
        ClipReward), as for :class:`~tfdata.ReplayBuffer`; default the fields of those names.
    stats_from : str, optional
        The dataset source whose statistics :class:`~tfdata.Normalize` reads: every row of
        it, computed once here (a mixed buffer keeps no running statistics of its own).
        Required with a Normalize, refused without; a buffer source is refused
        (NotImplementedError).

    Attributes
    ----------
    shared_format : bool
        Whether every source holds its rows in one row format: full batches are then in it.

    Raises
    ------
    SpecError
        Sources whose fields differ (the field and both sources' specs named).
    ValueError, TypeError
        Bad fractions, names, sources, seed. Nothing is built.
    """

    def __init__(self, sources: Mapping, fractions: Mapping | None = None, *, seed=None,
                 ring_size: int = 2, allocator=None, memory_budget=None, transforms=None,
                 roles=None, stats_from=None):
        from .. import alloc

        names, first = check_sources(sources)
        self._fractions = check_fractions(names, fractions)
        self.ring_size = check_int("ring_size", ring_size, 1, 1 << 16)
        if seed is None:
            import secrets

            seed = secrets.randbits(63)
        if isinstance(seed, (bool, float)) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed: expected an int or None, got {shown(seed)}")
        self.seed = int(seed) & MASK64
        self.memory_budget = None if memory_budget is None else parse_bytes("memory_budget", memory_budget)
        self.allocator = alloc.resolve(allocator)
        self.spec = sources[first].spec
        self._names, self._sources = tuple(names), dict(sources)
        self._samplers = {}  # name: the uniform sampler of a dataset source
        for i, n in enumerate(names):
            if not isinstance(sources[n], ReplayCore):
                self._samplers[n] = UniformSampler((self.seed + i) & MASK64)
        self._prioritized = any(isinstance(s, PrioritizedReplayBuffer) for s in sources.values())
        # the rows' holders: a dataset, or a buffer's storage; one row format for all of them
        # lets full batches be outputs of that format, each holder gathering with its own kernels
        self._holders = [s.storage if isinstance(s, ReplayCore) else s for s in sources.values()]
        formats = {h.row_format() for h in self._holders}
        self.shared_format = len(formats) == 1
        self._lock = threading.Lock()
        self._local = threading.local()
        self._rings = weakref.WeakSet()  # every thread's, for nbytes_parts
        self._projections: dict = {}  # (source, names): Projection
        # last: every other argument checked before the statistics' trees are allocated
        self._xf = MixedTransforms(self.spec, self._sources, transforms, roles, stats_from,
                                   self.allocator, self.memory_budget)

    # -- introspection -----------------------------------------------------------------------
    @property
    def sources(self) -> dict:
        """``{name: source}``, in batch order (a new dict)."""
        return dict(self._sources)

    @property
    def fractions(self) -> dict:
        """``{name: fraction}`` (a new dict)."""
        return dict(self._fractions)

    def shares(self, batch_size: int) -> dict:
        """``{name: rows}`` of a batch of ``batch_size`` rows (:func:`split`)."""
        return dict(zip(self._names, split(batch_size, self._fractions.values())))

    def __len__(self) -> int:
        """Rows held by all sources together."""
        return sum(len(s) for s in self._sources.values())

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}: {type(s).__name__}({len(s)} rows) x {self._fractions[n]:g}"
                          for n, s in self._sources.items())
        return f"MixedReplayBuffer({parts})"

    @property
    def transforms(self) -> tuple:
        """The transforms every batch gets, in order (``transforms=``)."""
        return self._xf.transforms

    @property
    def transform_parts(self) -> tuple:
        """The bound parts of :attr:`transforms` (what a state's ``transforms`` entry is of)."""
        return self._xf.parts

    @property
    def stats_from(self) -> str | None:
        """The dataset source whose statistics ``Normalize`` reads (``stats_from=``)."""
        return self._xf.stats_from

    def stats(self, name: str):
        """The statistics ``Normalize`` reads for field ``name``: of every row of the
        ``stats_from`` dataset (a :class:`~tfdata.replay.columns.FieldStats`: ``count``,
        ``mean``, ``var``, ...). ValueError for a field without them."""
        if self._xf.stats is None or name not in self._xf.stats_fields:
            raise ValueError(f"stats: no statistics of {name!r} are kept (those a Normalize of "
                             f"transforms= reads: {list(self._xf.stats_fields)})")
        return self._xf.stats.read(name)

    @property
    def config(self) -> dict:
        """What rebuilds this buffer beside its sources: source names and kinds, fractions,
        ring size (the seed is in the state) and, with transforms, ``transforms`` (each by
        name and parameters), ``stats_from`` and ``roles``."""
        config = {"sources": [[n, "buffer" if isinstance(s, ReplayCore) else "dataset"]
                              for n, s in self._sources.items()],
                  "fractions": dict(self._fractions), "ring_size": self.ring_size}
        if self._xf.transforms:
            config.update(self._xf.config())
        return config

    @classmethod
    def from_config(cls, config: Mapping, sources: Mapping, *, seed=None, transforms=(), **kwargs):
        """A buffer of ``config`` (a :attr:`config`) over ``sources`` (the same names and kinds);
        ``transforms``: the functions of yours its ``Compiled`` and ``Function`` transforms
        name (resolved only among them, as :meth:`load`)."""
        from ..transforms import from_config

        kinds = [list(x) for x in config["sources"]]
        given = [[n, "buffer" if isinstance(s, ReplayCore) else "dataset"] for n, s in sources.items()]
        if kinds != given:
            raise ValueError(f"sources: expected {kinds} (names and kinds, in order), got {given}")
        if "transforms" in config:
            kwargs.update(transforms=from_config(config["transforms"], transforms),
                          stats_from=config["stats_from"], roles=config["roles"])
        return cls(sources, config["fractions"], seed=seed, ring_size=config["ring_size"], **kwargs)

    # -- memory ------------------------------------------------------------------------------
    def plan_ring(self, batch_size: int, fields=None) -> int:
        """Bytes of one output ring of ``batch_size`` rows (of ``fields``, default all):
        per batch the rows (in the sources' row format when they share one, else the columns),
        indices (8 bytes a row), ``source`` (1), ``weights`` (4),
        ``versions`` (4, with a prioritized source) and each buffer source's sampler arrays for
        its rows (its ``ring_nbytes``), and the transforms' output arrays."""
        if fields is None and self.shared_format:
            row = self._holders[0].row_nbytes  # the format's rows, padding included
        else:
            row = sum(self.spec[n].nbytes for n in (self.spec.names if fields is None
                                                    else self.spec.select(fields)))
        row += 8 + 1 + 4 + (4 if self._prioritized else 0)
        per = batch_size * row + sum(
            s.sampler.ring_nbytes(k, None) for s, k in zip(self._sources.values(),
                                                           split(batch_size, self._fractions.values()))
            if isinstance(s, ReplayCore))
        per += self._xf.ring_nbytes(batch_size, None if fields is None else tuple(
            self.spec.select(fields)))
        return self.ring_size * per

    @property
    def nbytes_parts(self) -> dict:
        """``{"output_rings": bytes}``: every thread's rings (the sources' memory is theirs);
        with ``stats_from``, ``"trees"``: the trees of the statistics ``Normalize`` reads."""
        parts = {"output_rings": int(sum(r.nbytes for r in list(self._rings)))}
        if self._xf.stats is not None:
            parts["trees"] = self._xf.nbytes
        return parts

    @property
    def nbytes(self) -> int:
        return sum(self.nbytes_parts.values())

    # -- sampling ----------------------------------------------------------------------------
    def _projection(self, i: int, names: tuple) -> Projection:
        # one C-contiguous column per field whatever the source's layout: every source writes
        # the same output
        key = (i, names)
        p = self._projections.get(key)
        if p is None:
            src = self._holders[i]
            p = self._projections[key] = Projection(self.spec, names, src.byte_bases(), src.spans(),
                                                    self.allocator)
        return p

    def _window(self, out, own: bool, i: int, names, at: int, k: int) -> Output:
        """Rows ``[at, at + k)`` of ``out`` (in the sources' own format, or columns) as source
        ``i``'s kernels fill them."""
        if own:
            return self._holders[i].window(out, at, k)
        proj = self._projection(i, names)
        return Output(out.indices[at:at + k], {}, proj.kernel_rows(out, at, k), None, proj)

    def _new_ring(self, batch_size: int, names: tuple, key, whole: bool) -> _Ring:
        ks = split(batch_size, self._fractions.values())
        own = whole and self.shared_format  # else one C-contiguous column per field
        check_shares(batch_size, ks, self._fractions, self._sources)
        parts = self._xf.parts if whole else self._xf.project(names)  # refuses before allocating
        planned = self.plan_ring(batch_size, None if whole else names)
        if self.memory_budget is not None and self.nbytes + planned > self.memory_budget:
            raise MemoryBudgetError(f"memory_budget {self.memory_budget} bytes: an output ring of "
                                    f"batch_size {batch_size} needs {planned} bytes beside the "
                                    f"{self.nbytes} held")
        a, ring = self.allocator, _Ring()
        ring.draws, ring.batches, ring.next, ring.keep = [], [], 0, []
        # the buffer sources, whose rows held can change: checked before any source draws when
        # there are two (with one, its own draw refuses first: it draws before the datasets)
        ring.shares = [(self._sources[n], k, n) for n, k in zip(self._names, ks)
                       if isinstance(self._sources[n], ReplayCore)]
        ring.need = ring.shares if len(ring.shares) > 1 else ()
        for _ in range(self.ring_size):
            out = (self._holders[0].new_output(batch_size, a) if own
                   else self._projection(0, names).new_output(batch_size, a))
            source = a.zeros(batch_size, np.uint8)
            weights = a.zeros(batch_size, np.float32)
            weights[:] = 1.0
            versions = a.zeros(batch_size, np.uint32) if self._prioritized else None
            first, draws, at = [], [], 0
            for i, (n, k) in enumerate(zip(self._names, ks)):
                source[at:at + k] = i
                s, win = self._sources[n], self._window(out, own, i, names, at, k)
                if isinstance(s, ReplayCore):
                    arrays, shown_as = s.sampler.ring_arrays(k, None, win), {}
                    ring.keep.append(dict(arrays))  # as allocated (what the plan counts)
                    s.sampler.batch_view(arrays, {}, shown_as)
                    for key_, v in list(arrays.items()):  # the batch's own rows, not a copy
                        if v is shown_as.get("weights"):
                            arrays[key_] = weights[at:at + k]
                        elif v is shown_as.get("versions") and versions is not None:
                            arrays[key_] = versions[at:at + k]
                    first.append(s.sample_into_call(win, arrays))
                else:
                    draws.append(self._samplers[n].sample_call(len(s), win, {}))
                at += k
            ring.keep += [out, source, weights]  # the output: its indices and rows
            if versions is not None:
                ring.keep.append(versions)
            # the transforms, over the whole batch once every source has gathered: each takes
            # the fields as the ones before it left them, and shows its outputs instead
            fields, after = dict(out.fields), []
            for p in parts:
                arrays = p.ring_arrays(batch_size, None, out)
                p.batch_view(arrays, fields, {})
                ring.keep.append(arrays)
                after.append(partial(p.apply, out, arrays, out.indices, None))
            # one sequence per slot: the buffers first (they can refuse), then the datasets,
            # then the transforms
            ring.draws.append(tuple(first + draws + after))
            ring.batches.append(MixedBatch({m: fields[m] for m in names}, out.indices, source,
                                           weights, versions))
        rings = getattr(self._local, "rings", None)
        if rings is None:
            rings = self._local.rings = {}
        rings[key] = ring
        if not own:  # fields= every field: the same columns
            rings[(batch_size, names)] = ring
        ring.nbytes = int(sum(sum(v.nbytes for v in x.values() if isinstance(v, np.ndarray))
                              if isinstance(x, dict) else x.nbytes for x in ring.keep))
        self._rings.add(ring)
        return ring

    def sample(self, batch_size: int, *, copy: bool = False, fields=None) -> MixedBatch:
        """One batch: each source's share of rows (:meth:`shares`), drawn by its sampler
        straight into its rows of the batch.

        Parameters
        ----------
        batch_size : int
            Every source gets at least one row, and no more than it holds; both checked before
            a new output ring is allocated (ValueError naming the source).
        copy : bool, default False
            False: views into this thread's output ring, valid until this thread has sampled
            ``ring_size`` more batches of this size and fields (a batch held then goes stale:
            :class:`~tfdata.StaleBatchError`); True: arrays that are the caller's.
        fields : list of str, optional
            Only these fields (the same rows and random numbers as a full batch).

        Returns
        -------
        MixedBatch
            ``batch[name]``: ``spec[name].dtype``, ``(batch_size, *shape)``: with
            :attr:`shared_format` as a buffer of the sources' layout shows it (strided views of
            records for AoS, of a group's block), else and with ``fields`` C-contiguous.
            ``source``, ``indices``, ``weights``, ``versions`` as :class:`MixedBatch` says.
            The same seed and source states give the same batches, bit for bit, whatever the
            sources' layouts.
        """
        if type(batch_size) is not int:
            batch_size = check_int("batch_size", batch_size, 1)
        key = batch_size if fields is None else (batch_size, fields_key(fields))
        try:
            ring = self._local.rings[key]
        except (AttributeError, KeyError, TypeError):
            names = self.spec.names if fields is None else self.spec.select(fields)
            ring = self._new_ring(check_int("batch_size", batch_size, 1), names, key, fields is None)
        with self._lock:
            for s, k, n in ring.need:  # before any source draws: a refused batch draws nothing
                if k > len(s):
                    refuse_short(s, k, n, batch_size)
            i = ring.next
            try:
                for draw in ring.draws[i]:  # and the transforms after them
                    draw()
            except ValueError:
                for s, k, n in ring.shares:
                    if k > len(s):
                        refuse_short(s, k, n, batch_size)
                raise
            ring.next = (i + 1) % len(ring.batches)
            batch = ring.batches[i]
            if getrefcount(batch) > UNHELD:
                batch = ring.batches[i] = retire(batch)
        return batch.copy() if copy else batch

    def update_priorities(self, batch: MixedBatch, priorities) -> None:
        """Route ``priorities`` (float ``(batch_size,)``) of a batch of this buffer to its
        prioritized sources, each with its own checks (values, slots, rows overwritten since
        the sample, by the batch's versions); rows of other sources are ignored (their values
        are not read). Every update is checked before any is applied, with every prioritized
        source's lock held: a refusal (ValueError, StaleBatchError) changes nothing."""
        if not isinstance(batch, MixedBatch):
            raise TypeError(f"update_priorities: expected a MixedBatch of this buffer, got "
                            f"{type(batch).__name__}")
        source, idx, versions = batch.source, batch.indices, batch.versions  # stale: raises
        p = np.asarray(priorities, dtype=np.float64)
        if p.shape != idx.shape:
            raise SpecError(f"update_priorities: expected priorities of shape {idx.shape}, got "
                            f"shape {p.shape}")
        targets = [(i, s) for i, s in enumerate(self._sources.values())
                   if isinstance(s, PrioritizedReplayBuffer)]
        locks = [s.lock for _, s in targets]
        for lock in locks:  # in source order, always: no two callers wait on each other
            lock.acquire()
        try:
            prepared = []
            for i, s in targets:
                rows = source == i
                prepared.append((s, s.prepare_update(Batch({}, idx[rows], versions=versions[rows]),
                                                     p[rows])))
            for s, prep in prepared:
                s.apply_update(prep)
        finally:
            for lock in reversed(locks):
                lock.release()

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The RNG positions of the dataset sources' samplers: ``{"seed", "datasets": {name:
        counter}}``, and with transforms ``"transforms"``: each one's state (RandomShift's
        ``{"seed", "counter"}``, None for a transform without state). The buffer sources'
        states are theirs (their ``state_dict``), not included; :meth:`save` writes them beside
        this one."""
        with self._lock:
            state = {"seed": self.seed, "datasets": {n: s.counter for n, s in self._samplers.items()}}
            if self._xf.parts:
                state["transforms"] = self._xf.state_dict()
            return state

    def check_state(self, state) -> tuple:
        """Validate a :meth:`state_dict` (untrusted: every key and value), nothing changed;
        :class:`~tfdata.replay.samplers.StateError` naming the field."""
        keys = {"seed", "datasets"} | ({"transforms"} if self._xf.parts else set())
        if not isinstance(state, Mapping) or set(state) != keys:
            raise StateError("state", f"an object of the keys {sorted(keys)}", shown(state))
        seed = state_int(state, "seed", "seed", 0, MASK64)
        d = state["datasets"]
        if not isinstance(d, Mapping) or set(d) != set(self._samplers):
            raise StateError("datasets", f"one counter per dataset source {sorted(self._samplers)}",
                             shown(d))
        counters = {n: state_int(d, n, f"datasets.{n}", 0, MASK64) for n in self._samplers}
        return seed, counters, self._xf.check_state(state.get("transforms"))

    def load_state_dict(self, state) -> None:
        """Restore a :meth:`state_dict` (checked in full first)."""
        seed, counters, transforms = self.check_state(state)
        with self._lock:
            self.seed = seed
            for i, n in enumerate(self._names):
                if n in counters:
                    self._samplers[n].load_state(((seed + i) & MASK64, counters[n]))
            self._xf.load_state(transforms)

    def save(self, path, *, overwrite: bool = False) -> None:
        """Write a checkpoint directory: this buffer's config and state, each buffer source as
        its own checkpoint inside, each dataset source by reference (its path and identity,
        never its rows; see :mod:`tfdata.replay.mixed_files`). Atomic: written beside ``path``,
        then renamed; ``overwrite=True`` replaces only a mixed checkpoint. TypeError, before
        anything is written, for a transform whose function has no import path (a lambda)."""
        reason = self._xf.unsaved_reason()
        if reason is not None:
            raise TypeError(f"save: {reason}; a checkpoint could not rebuild it (nothing was "
                            f"written)")
        mixed_files.save(self, path, overwrite)

    @classmethod
    def load(cls, path, *, datasets=None, samplers=(), transforms=(), **kwargs) -> "MixedReplayBuffer":
        """Rebuild a buffer saved with :meth:`save`; it continues with the same batches.
        ``datasets``: ``{name: dataset}`` for dataset sources not opened from their recorded
        path (an ArrayDataset's; checked against the recorded rows and spec). ``samplers``: as
        for :meth:`tfdata.ReplayBuffer.load`. ``transforms``: the functions of yours the
        checkpoint's ``Compiled`` and ``Function`` transforms may name (an allow-list by import
        path ``module:qualname``; nothing else is imported or called), as for
        :meth:`tfdata.ReplayBuffer.load`. FormatError (naming file and field) for a checkpoint
        it will not read, a function not among those given, or a dataset that changed since
        the save."""
        return mixed_files.load(cls, path, datasets or {}, samplers, transforms, kwargs)
