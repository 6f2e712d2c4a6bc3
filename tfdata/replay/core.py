"""The replay core: a spec, a storage, a writer, a sampler and transforms behind one lock.

:class:`ReplayCore` holds the parts and does what no part can do alone: validation of rows,
the lock, the per-thread output rings, the memory budget, and the state dict. It knows no
layout (the storage does), no sampling rule (the sampler does), no write position (the writer
does) and no n-step or elision arithmetic (the transforms do). :class:`tfdata.ReplayBuffer` and
:class:`tfdata.PrioritizedReplayBuffer` are constructors that pick the parts; the parts'
contracts are in :mod:`tfdata.replay.samplers`, :mod:`tfdata.replay.writers` and
:mod:`tfdata.replay.transforms`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Mapping

import numpy as np

from .._budget import check_budget, parse_bytes
from .._checks import bad_slot, check_int
from ..batch import UNHELD, Batch, OutputRing, getrefcount, retire
from ..errors import SpecError
from ..spec import Spec
from ..storage import (isolate_layout, make_storage, output_nbytes, resolve_layout, restrict_layout,
                       storage_nbytes)
from . import combinations, planning
from .columns import Column, RunningStats, check_stats_fields, scan, stats_nbytes
from .episodes import Episodes, stored_spec
from .limiter import RateLimiter
from .frames import FrameStack, FrameStacks, frame_spec, padding_config, resolve_frames
from .samplers import Sampler, sampler_name
from .transforms import ElideNext, NStep, episode_options
from .writers import RingWriter

STATE_FORMAT = "tfdata.ReplayBuffer"
STATE_VERSION = 1
#: the keys of a state dict that are not a sampler's: every other key is the part a sampler
#: adds under its ``state_key`` (see :meth:`ReplayCore.load_state_dict`)
STATE_KEYS = frozenset({"format", "version", "spec", "capacity", "layout", "writer", "sampler",
                        "data", "num_envs", "episodes", "frames", "stats", "rate_limiter"})
# Lemire's multiply-shift draws from the top 32 bits of each random word
MAX_CAPACITY = (1 << 32) - 1
# sample_sequences(policy="reject"): draws per slice before concluding no slice exists
MAX_DRAWS = 10_000
# the constructor's arguments that change what a buffer holds (see ReplayCore.plan_memory)
CONFIG_DEFAULTS = dict(layout=None, ring_size=2, num_envs=1, n_step=None, gamma=0.99,
                       next_of="auto", elide_next=False, roles=None, spill_path=None,
                       hot_rows=None, hot_bytes=None, stats=None, frame_stack=None,
                       frame_padding="reset", compress_cold=False)


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


def weak_method(obj, name: str):
    """``getattr(obj, name)`` as a function that does not keep ``obj`` alive.

    A bound method stored on its own object is a reference cycle: the buffer (and its storage,
    possibly gigabytes) would then wait for the cyclic garbage collector after ``del``.
    """
    ref = weakref.ref(obj)
    func = getattr(type(obj), name)

    def call(*args):
        return func(ref(), *args)

    return call


class _SpillHook:
    """A spilling storage's release policy as a write hook (and a sample hook)."""

    hears_writes = True

    def __init__(self, spill):
        self.spill = spill

    def on_write(self, spans, n, extra) -> None:
        self.spill.after_write(n)

    def slot_hook(self):
        after_write = self.spill.after_write

        def on_write(slot, _f=after_write):
            _f(1)

        return on_write

    def on_clear(self) -> None:
        self.spill.reset()


class _ColdHook:
    """The compressed cold tiers of a spilling frame-stacked buffer as a write hook (before the
    spill policy's: a block is compressed while its frames are still resident)."""

    hears_writes = True

    def __init__(self, tiers):
        self.tiers = tiers

    def on_write(self, spans, n, extra) -> None:
        for t in self.tiers:
            t.after_write(spans, n)

    def slot_hook(self):
        return None  # frame-stacked buffers write through the array path only

    def on_clear(self) -> None:
        for t in self.tiers:
            t.reset()


class _Drawable:
    """The rows a sampler lets a batch draw, as ``size`` (what the rate limiter reads of the
    rows held): for a sampler that holds rows back (:meth:`Sampler.drawable`)."""

    __slots__ = ("sampler", "writer")

    def __init__(self, sampler, writer):
        self.sampler, self.writer = sampler, writer

    @property
    def size(self) -> int:
        return self.sampler.drawable(self.writer.size)


class ReplayCore:
    """The parts and the lock; see :class:`tfdata.ReplayBuffer` for the public behaviour."""

    def __init__(self, spec, capacity: int, sampler, *, layout=None, ring_size: int = 2,
                 num_envs: int = 1, n_step=None, gamma: float = 0.99, next_of="auto",
                 elide_next: bool = False, roles=None, spill_path=None, hot_rows=None,
                 hot_bytes=None, allocator=None, memory_budget=None, stats=None,
                 rate_limiter=None, frame_stack=None, frame_padding="reset", compress_cold=False):
        from .. import alloc

        self.sampler = sampler  # before _configure, which checks what frame stacks need of it
        self._configure(spec, capacity, layout=layout, ring_size=ring_size, num_envs=num_envs,
                        n_step=n_step, gamma=gamma, next_of=next_of, elide_next=elide_next,
                        roles=roles, spill_path=spill_path, hot_rows=hot_rows, hot_bytes=hot_bytes,
                        stats=stats, frame_stack=frame_stack, frame_padding=frame_padding,
                        compress_cold=compress_cold, rate_limiter=rate_limiter)
        capacity = self._capacity
        if self.compress_cold:
            from ..storage import cold

            cold.codec()  # ImportError naming the extra, before anything is allocated
        self.allocator = alloc.resolve(allocator)
        self.memory_budget = None if memory_budget is None else parse_bytes("memory_budget", memory_budget)
        if self.memory_budget is not None:  # refuse before allocating anything
            # (the compressed blocks are budgeted as they are made: see nbytes_parts["cold"])
            self._check_budget(self._planned_parts(cold_bound=False),
                               f"{type(self).__name__} of capacity {capacity}", construction=True)
        self._rings = weakref.WeakSet()  # every thread's output rings, for nbytes
        self._episodes = None
        if self._tracks_episodes:
            # (without elision, next_of only names the pairs: n-step's stored next fields)
            self._episodes = Episodes(self._frame_spec, capacity, self.num_envs, self._roles,
                                      self._elided or self.next_of, bool(self._elided), self.allocator,
                                      weak_method(self, "_grow_budget"))
        self._frame_stacks = None
        if self._frames is not None:  # (_configure refused a sampler off stream order)
            self._frame_stacks = FrameStacks(self.spec, self._frames, capacity, self.num_envs,
                                             self._roles, self.allocator)
        hooks = []
        self._spill = None
        if self.spill_path is None:
            self._storage = make_storage(self._stored, capacity, self._stored_layout, allocator=self.allocator)
        else:
            from ..storage.files import map_storage
            from ..storage.spill import Spill

            data, maps = map_storage(self.spill_path, self._stored, capacity, self._stored_layout)
            self._spill = Spill(maps, capacity, self.hot_rows, self._row_nbytes())
            self._storage = make_storage(self._stored, capacity, self._stored_layout, backing=data,
                                         allocator=self.allocator)
        self.sampler.bind(self._storage, capacity, self.num_envs, self.allocator)
        if self.sampler.hears_writes:
            hooks.append(self.sampler)
        self._cold = {}
        if self.compress_cold:
            from ..storage.cold import ColdFrames

            self._frame_stacks.bind(self._storage)
            for name in self._stacked:
                word, words, off, width = self._frame_stacks.source(name)
                if off != 0 or words.shape[1] != width:  # isolate_layout makes it a column
                    raise AssertionError(f"frames of {name!r} are not a column of their own")
                self._cold[name] = ColdFrames(words, self.hot_rows, self.allocator,
                                              room=None if self.memory_budget is None
                                              else weak_method(self, "_cold_room"))
            hooks.append(_ColdHook(list(self._cold.values())))
        if self._spill is not None:
            hooks.append(_SpillHook(self._spill))
        self._stats = None
        if self._stats_fields:  # hears only laps: pushes and extends do no statistics work
            self._stats = RunningStats(self._stored, self._stats_fields, capacity, self.allocator)
            hooks.append(self._stats)
        self._writer = RingWriter(capacity, self.num_envs)
        self._writer.bind(self.spec, self._storage, self._episodes, hooks, self._frame_stacks)
        watch = getattr(self.sampler, "watch", None)
        if watch is not None:  # a sampler that places writes by the writer's cursor
            watch(self._writer)
        if self._stats is not None:
            self._stats.bind(self._storage, self._writer)
        self._transforms = []
        if self.n_step is not None:
            self._transforms.append(NStep(self._storage, self.spec, self._roles, self.next_of,
                                          self.n_step, self.gamma, self.num_envs, capacity, self.allocator))
        plain = {n: s for n, s in self._elided.items() if s not in self._stacked}
        if plain:
            self._transforms.append(ElideNext(self._storage, self.spec, self._episodes, self._roles,
                                              plain, self.num_envs, capacity, self.allocator))
        if self._frame_stacks is not None:
            self._frame_stacks.bind(self._storage)
            flags = (self._storage.field(self._roles["terminated"]),
                     self._storage.field(self._roles["truncated"]))
            self._transforms.append(FrameStack(self.spec, self._frame_stacks, self._episodes, flags,
                                               self.num_envs, capacity, self.allocator, self._writer,
                                               self._cold))
        self._lock = threading.Lock()
        use_lock = getattr(self.sampler, "use_lock", None)
        if use_lock is not None:  # a sampler whose gate or sample waits on a condition of it
            use_lock(self._lock)
        # output rings are per thread: a thread's batch stays valid until that same thread has
        # sampled ring_size more times, whatever other threads do
        self._local = threading.local()
        self._limiter = None
        gates = {}
        if rate_limiter is not None:
            gates = self._bind_limiter(rate_limiter)
            # what a limited sample waits for: the rows held (the writer's size, an attribute),
            # or the rows a sampler that holds some back lets a batch draw
            held_back = getattr(type(self.sampler), "drawable", Sampler.drawable) is not Sampler.drawable
            self._held = _Drawable(self.sampler, self._writer) if held_back else self._writer
        self._fast_push = self._writer.make_push(self.spec, self._lock, weak_method(self, "_checked_push"),
                                                 gate=gates.get("push"))
        if type(self).push is ReplayCore.push:
            # the generated push itself, not a method that calls it: one Python call less per row
            # (about 70 ns of a 700 ns push); ReplayCore.push keeps the documentation
            self.push = self._fast_push
        if type(self).extend is ReplayCore.extend:  # the same for a vector env's step
            self.extend = self._writer.make_extend(self.spec, self._lock,
                                                   weak_method(self, "_checked_extend"),
                                                   weak_method(self, "_write_values"),
                                                   gate=gates.get("extend"))

    def _bind_limiter(self, limiter) -> dict:
        """Take ``limiter`` (a :class:`~tfdata.replay.limiter.RateLimiter`, not another
        buffer's); the gates the generated push and extend call under the lock."""
        from .limiter import RateLimiter

        if not isinstance(limiter, RateLimiter):
            raise TypeError(f"rate_limiter must be a tfdata.RateLimiter or None, got "
                            f"{type(limiter).__name__} {limiter!r:.100}")
        limiter.bind(self._lock, self, self._capacity)
        self._limiter = limiter
        return {"push": limiter.admit_insert, "extend": (limiter.insert_wait, limiter.inserted)}

    def _limiter_counts(self, state, size: int) -> dict:
        """The rate limiter's counts from a state (checked); a state without them (saved from
        a buffer without a limiter) starts balanced: the rows held inserted, and the samples
        the ratio expects of them beyond the minimum size."""
        lim = self._limiter
        if state is None:
            beyond = max(0, size - lim.min_size_to_sample)
            return {"inserts": size, "samples": int(beyond * lim.samples_per_insert)}
        return lim.check_state(state, size)

    @property
    def rate_limiter(self):
        """The :class:`~tfdata.RateLimiter` given as ``rate_limiter=``, or None."""
        return self._limiter

    def _configure(self, spec, capacity, *, layout, ring_size, num_envs, n_step, gamma, next_of,
                   elide_next, roles, spill_path, hot_rows, hot_bytes, stats=None, frame_stack=None,
                   frame_padding="reset", compress_cold=False, rate_limiter=None) -> None:
        """Check the arguments and derive what the buffer will hold; allocates nothing. The
        options are checked against each other by the table of
        :mod:`tfdata.replay.combinations` first."""
        self.spec = spec if isinstance(spec, Spec) else Spec(spec)
        capacity = check_int("capacity", capacity, 1, MAX_CAPACITY)
        self._ring_size = check_int("ring_size", ring_size, 1)
        self.num_envs = check_int("num_envs", num_envs, 1)
        if capacity % self.num_envs:
            lo = capacity - capacity % self.num_envs
            raise ValueError(f"capacity must be a multiple of num_envs={self.num_envs} (streams are "
                             f"interleaved step by step), got {capacity}; use {lo or self.num_envs} or "
                             f"{lo + self.num_envs}")
        self._capacity = capacity
        opts = episode_options(self.spec, n_step, gamma, next_of, elide_next, roles)
        self.n_step, self.gamma, self.next_of, self.elide_next = (
            opts["n_step"], opts["gamma"], opts["next_of"], opts["elide_next"])
        self._roles, self._has_flags = opts["roles"], opts["has_flags"]
        self._frames = resolve_frames(self.spec, frame_stack, frame_padding, self.next_of,
                                      self._has_flags)
        self._stacked = () if self._frames is None else tuple(self._frames["stacks"])
        if not isinstance(compress_cold, (bool, np.bool_)):
            raise TypeError(f"compress_cold must be True or False, got {type(compress_cold).__name__} "
                            f"{compress_cold!r:.100}")
        combinations.check(combinations.facets(
            type(self).__name__, **self.sampler.facets(), n_step=self.n_step,
            elide_next=bool(self.elide_next), frame_stack=self._frames is not None,
            compress_cold=bool(compress_cold), spill=spill_path is not None,
            stats=bool(stats), rate_limiter=rate_limiter.params() if isinstance(rate_limiter, RateLimiter) else None))
        if self._frames is not None:
            self._check_frames()
        # next fields not stored: every one with elide_next, and those of stacked fields
        elide = self._has_flags and self.elide_next
        self._elided = {n: s for n, s in self.next_of.items() if elide or s in self._stacked}
        self._frame_spec = frame_spec(self.spec, self._frames)
        self._stored = stored_spec(self._frame_spec, self._elided, bool(self._elided))
        self._stats_fields = check_stats_fields(self.spec, self._stored, stats, self._elided,
                                                bool(self._elided))
        # the layout of the spec's fields (what ``layout`` returns), and of the stored ones
        # (a stacked field's frames in a column of their own)
        self._layout = resolve_layout(layout, self.spec)
        self._stored_layout = isolate_layout(restrict_layout(self._layout, self._stored), self._stored,
                                             self._stacked)
        self.hot_rows = None  # rows kept resident, for a spilling buffer
        self.spill_path = None if spill_path is None else os.fspath(spill_path)
        self.compress_cold = bool(compress_cold)
        if self.spill_path is None:
            if hot_rows is not None or hot_bytes is not None:
                raise ValueError("hot_rows / hot_bytes need spill_path (the file that holds the cold rows)")
            return
        if (hot_rows is None) == (hot_bytes is None):
            raise ValueError("spill_path needs exactly one of hot_rows= or hot_bytes= (the part kept in RAM)")
        row = self._row_nbytes()
        if hot_bytes is not None:
            hot_rows = parse_bytes("hot_bytes", hot_bytes) // row
        self.hot_rows = min(check_int("hot_rows", hot_rows, 1), capacity)

    def _check_frames(self) -> None:
        """What frame stacks need of the capacity (refused before anything is allocated, and by
        :meth:`plan_memory`; what they need of the sampler is in the table of combinations)."""
        kmax = max(self._frames["stacks"].values())
        steps = self._capacity // self.num_envs
        if steps < kmax:
            raise ValueError(f"frame_stack: each stream holds capacity / num_envs = {steps} steps, "
                             f"fewer than a stack of {kmax} frames; use a capacity of at least "
                             f"{kmax * self.num_envs}")

    @classmethod
    def min_capacity(cls, spec, **options) -> int:
        """The smallest capacity a buffer of these options can have: ``num_envs`` rows, or with
        ``frame_stack`` a stack of frames per stream (``max(K) * num_envs``). Checks nothing else."""
        envs = check_int("num_envs", options.get("num_envs", 1), 1)
        fs = options.get("frame_stack")
        if fs is None:
            return envs
        ks = fs.values() if isinstance(fs, Mapping) else [fs]
        return envs * max([int(k) for k in ks if isinstance(k, (int, np.integer))] or [1])

    def _row_nbytes(self) -> int:
        return storage_nbytes(self._stored, 1, self._stored_layout)

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
        return cls._plan(spec, capacity, options, "plan_memory")._planned_parts(batch_sizes)

    @classmethod
    def _plan(cls, spec, capacity: int, options: dict, what: str) -> "ReplayCore":
        """An unbuilt buffer of these arguments, configured (checked), nothing allocated."""
        plan = cls.__new__(cls)
        plan.sampler = cls._planned_sampler(options)
        for k in ("seed", "allocator", "memory_budget"):  # no effect on the bytes held
            options.pop(k, None)
        limiter = options.pop("rate_limiter", None)  # none either, but it combines or not
        bad = set(options) - set(CONFIG_DEFAULTS)
        if bad:
            raise TypeError(f"{what}: unexpected keyword(s) {sorted(bad)}; allowed: "
                            f"{sorted(CONFIG_DEFAULTS)}")
        plan._configure(spec, capacity, rate_limiter=limiter,
                        **{k: options.get(k, v) for k, v in CONFIG_DEFAULTS.items()})
        return plan

    @classmethod
    def plan_storage(cls, spec, capacity: int, **options) -> dict:
        """What a buffer built with these arguments stores, without building it (a checkpoint
        checks its files against this): ``stored`` (the Spec of the stored fields: next fields
        elided or rebuilt left out, stacked fields one frame wide), ``layout`` (the storage's
        layout of them), ``episodes`` (``(spec, next_of, elide)`` of the episode bookkeeping, or
        None when none is kept) and ``frames`` (the resolved frame stacks, or None)."""
        plan = cls._plan(spec, capacity, dict(options), "plan_storage")
        episodes = None
        if plan._tracks_episodes:
            episodes = (plan._frame_spec, dict(plan._elided or plan.next_of), bool(plan._elided))
        return {"stored": plan._stored, "layout": plan._stored_layout, "episodes": episodes,
                "frames": plan._frames}

    @classmethod
    def _planned_sampler(cls, options: dict):
        """The (unbound) sampler a buffer built with ``options`` would have; pops its options."""
        raise NotImplementedError

    @property
    def _tracks_episodes(self) -> bool:
        """Episode numbers are kept: the spec has the flags and the writer keeps stream order
        (a sampler that places writes off it, exactly-k, has none to number)."""
        return self._has_flags and getattr(getattr(self, "sampler", None), "stream_order", True)

    def _planned_parts(self, batch_sizes=(), cold_bound: bool = True) -> dict:
        cap = self._capacity
        storage = storage_nbytes(self._stored, cap if self.hot_rows is None else self.hot_rows,
                                 self._stored_layout)
        book = 0
        if self._tracks_episodes:
            book = Episodes.planned_nbytes(self._frame_spec, cap, self.num_envs, self._elided,
                                           bool(self._elided))
            if self._frames is not None:
                book += FrameStacks.planned_nbytes(self.spec, self._frames, cap, self.num_envs)
        rings = sum(self._ring_size * (self._planned_ring(*b) if isinstance(b, tuple) else self._planned_ring(b))
                    for b in batch_sizes)
        sampler = self.sampler.plan(cap)
        trees = sampler["trees"] + stats_nbytes(self._stored, self._stats_fields, cap)
        parts = {"storage": storage, "bookkeeping": book + sampler["bookkeeping"],
                 "trees": trees, "output_rings": rings}
        if self.compress_cold:
            parts["cold"] = self._planned_cold(cold_bound)
        return parts

    def _planned_cold(self, bound: bool) -> int:
        """The cold tiers' tables and caches, plus (``bound``) a bound of their compressed
        blocks: every frame that can be cold, uncompressed."""
        from ..storage.cold import planned_nbytes

        total = 0
        for name, k in self._frames["stacks"].items():
            fixed, most = planned_nbytes(self._capacity, self.hot_rows, self.spec[name].nbytes // k)
            total += fixed + (most if bound else 0)
        return total

    def _planned_ring(self, batch_size: int, length: int | None = None, fields=None) -> int:
        """Bytes of one slot of an output ring (see :class:`tfdata.batch.OutputRing`); of a
        ring of the fields ``fields`` only, if given."""
        rows = batch_size * (length or 1)
        stored = None
        if fields is not None:
            fields = self.spec.select(fields)
            stored = [n for n in fields if n in self._stored and n not in self._stacked]
        elif self._stacked:
            stored = [n for n in self._stored.names if n not in self._stacked]
        total = (output_nbytes(self._stored, rows, self._stored_layout, stored)
                 + self.sampler.ring_nbytes(batch_size, length))
        if self._has_flags:
            plain = {n: s for n, s in self._elided.items() if s not in self._stacked}
            if plain:
                total += ElideNext.plan_ring(self.spec, plain, rows, fields)
            if self._frames is not None:
                total += FrameStack.plan_ring(self.spec, self._frames, rows, fields)
            if self.n_step is not None:
                total += NStep.plan_ring(rows, length, self._roles, fields)
        return total

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
        storage = self._storage.nbytes if self.hot_rows is None else self.hot_rows * self._row_nbytes()
        book = 0 if self._episodes is None else self._episodes.nbytes
        if self._frame_stacks is not None:
            book += self._frame_stacks.nbytes
        rings = sum(r.nbytes for r in list(self._rings))
        sampler = self.sampler.nbytes
        trees = sampler["trees"] + (0 if self._stats is None else self._stats.nbytes)
        parts = {"storage": int(storage), "bookkeeping": int(book + sampler["bookkeeping"]),
                 "trees": int(trees), "output_rings": int(rings)}
        if self.compress_cold:
            parts["cold"] = int(sum(c.nbytes for c in self._cold.values()))
        return parts

    def _cold_room(self) -> int:
        """Bytes the memory budget has left, for a compressed block (see ColdFrames)."""
        return self.memory_budget - self.nbytes

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

    @property
    def nbytes(self) -> int:
        """Total of :attr:`nbytes_parts`: every byte of memory this buffer allocated."""
        return sum(self.nbytes_parts.values())

    def _check_budget(self, parts: dict, what: str, construction: bool = False,
                      locked: bool = True) -> None:
        fits = None
        over = sum(parts.values()) - self.memory_budget
        tiers = getattr(self, "_cold", None)
        if (over > 0 and not construction and tiers
                and over <= sum(t.compressed for t in tiers.values())):
            # compressed copies are a cache of the file: drop them (the oldest rows' first)
            # rather than refuse something the buffer needs (a refusal drops none)
            with contextlib.nullcontext() if locked else self._lock:
                freed = sum(t.shed(over) for t in self._cold.values())
            parts["cold"] -= freed
        if construction and sum(parts.values()) > self.memory_budget:
            opts = {"layout": self._layout, "num_envs": self.num_envs, "n_step": self.n_step,
                    "elide_next": self.elide_next, "next_of": self.next_of, "roles": self._roles,
                    "stats": self._stats_fields or None}
            if self._frames is not None:
                opts.update(frame_stack=dict(self._frames["stacks"]),
                            frame_padding=dict(self._frames["padding"]))
            cap = planning.max_capacity(type(self), self.spec, self.memory_budget, **opts)
            fits = f"the largest capacity that fits is {cap}" if cap else "no capacity fits"
        check_budget(self.memory_budget, parts, what, fits)

    def _grow_budget(self, extra: int) -> None:
        """Refuse (MemoryBudgetError) a growth of ``extra`` bytes that would exceed the budget."""
        if self.memory_budget is not None:
            parts = self.nbytes_parts
            parts["growth"] = extra
            self._check_budget(parts, "growing the table of episode-final values")

    # -- introspection ----------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._writer.capacity

    @property
    def layout(self):
        """``"aos"``, ``"soa"`` or the grouping (a tuple of tuples of field names, normalised:
        ``layout=buffer.layout`` builds the same storage)."""
        return self._layout

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
        return dict(self._roles)

    @property
    def ring_size(self) -> int:
        return self._ring_size

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

    def _checked_push(self, row: Mapping, extra=None) -> None:
        # the generic path: full validation with precise errors, then the same writes
        self._push_checked(self.spec.check_row(row), extra)

    def _push_checked(self, values: list, extra) -> None:
        """Write one checked row under the lock, after the rate limiter (if any) lets it in,
        counted with the write."""
        lim = self._limiter
        with self._lock:
            if lim is not None:
                lim.insert_wait(1)
            self._writer.push_values(values, extra)
            if lim is not None:
                lim.inserted(1)

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
        self._checked_extend(batch)

    def _write_values(self, values: list, n: int) -> None:
        # n >= 1 rows whose fields the caller has checked (exact dtypes and shapes)
        self._write_checked(values, n, None)

    def _write_checked(self, values: list, n: int, extra) -> None:
        """Write ``n >= 1`` checked rows under the lock, after the rate limiter (if any) lets
        them in, counted with the write."""
        lim = self._limiter
        if lim is not None:
            lim.check_insert(n)  # before the lock: an insert that can never proceed
        with self._lock:
            if lim is not None:
                lim.insert_wait(n)
            self._writer.write(values, n, extra)
            if lim is not None:
                lim.inserted(n)

    def _checked_extend(self, batch: Mapping) -> None:
        # the generic path: full validation with precise errors, then the same writes
        n, values = self.spec.check_batch(batch)
        if n == 0:
            return
        self._write_checked(values, n, None)

    def clear(self, *, wipe: bool = False) -> None:
        """Forget every row. ``wipe=True`` also overwrites the storage with zeros. A rate
        limiter's counts go back to 0 (its wait metrics stay): sampling waits for
        ``min_size_to_sample`` new rows, as after construction."""
        with self._lock:
            if self._limiter is not None:
                self._limiter.reset()
            if wipe:
                self._storage.wipe()
            self._writer.reset()  # and the write hooks: sampler, spill (releases the pages)
            if self._episodes is not None:
                self._episodes.clear(wipe)
            if self._frame_stacks is not None:
                self._frame_stacks.clear(wipe)
            if not self.sampler.hears_writes:
                self.sampler.on_clear()

    # -- sampling ---------------------------------------------------------------------------
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
            ``batch[name]`` has dtype ``spec[name].dtype`` and shape
            ``(batch_size, *spec[name].shape)``; ``batch.indices`` (int64, ``(batch_size,)``)
            holds the storage slots. A prioritized buffer also sets ``batch.weights`` (float32
            importance weights, at most 1) and ``batch.versions``.
        """
        if self._limiter is not None:  # one check (25 ns) for buffers without a limiter
            return self._limited_sample(batch_size, copy, fields)
        if type(batch_size) is not int:  # 2.0 or True would find the ring of 2 or 1
            batch_size = check_int("batch_size", batch_size, 1)
        if fields is None:
            key = batch_size
        else:  # a list or tuple inline: a call of fields_key costs 50 ns
            t = type(fields)
            key = (batch_size, fields if t is tuple else tuple(fields) if t is list else fields_key(fields))
        try:
            ring = self._local.rings[key]
        except (AttributeError, KeyError, TypeError):
            names = None if fields is None else self._check_fields(fields, key[1])
            n = self._writer.size
            if batch_size > n and self._short(batch_size):  # check, then allocate: a refused
                raise ValueError(self._too_few_rows(batch_size, n))  # sample builds no ring
            ring = self._new_ring(batch_size, fields=names, key=key)
        # the context-manager protocol called by hand: 100 ns against 150 ns for ``with`` (Python
        # 3.11); acquire/release (70 ns) would need a Lock, not any context manager
        lock = self._lock
        lock.__enter__()
        try:
            n = self._writer.size  # again: a clear() may have run since
            if batch_size > n and self._short(batch_size):
                raise ValueError(self._too_few_rows(batch_size, n))
            i = ring.next
            out, arrays = ring.slots[i], ring.arrays[i]
            self.sampler.sample(n, out, arrays[0])
            ring.next = (i + 1) % len(ring.slots)  # a sampler that refused took no slot
            w = self._writer
            transforms = ring.transforms
            if transforms:
                rows, cursor = out.indices, w.cursor
                for t, a in zip(transforms, arrays[1:]):
                    rows = t.apply(out, a, rows, cursor)
            if self._spill is not None:
                self._spill.after_sample()
            position = w.laps * w.capacity + w.cursor  # (writer.position, inline)
        finally:
            lock.__exit__(None, None, None)
        batch = ring.batches[i]
        if getrefcount(batch) > UNHELD:  # the slot's previous batch is still held: retire it
            batch = ring.batches[i] = retire(batch)
        batch.write_position = position  # what update_field(name, batch, ...) checks rows by
        return batch.copy() if copy else batch

    def _limited_sample(self, batch_size: int, copy: bool = False, fields=None):
        # sample() with a rate limiter: waits (the lock released) until the limiter and the
        # rows held allow the batch, then samples and counts it under the lock
        if type(batch_size) is not int:
            batch_size = check_int("batch_size", batch_size, 1)
        if fields is None:
            key = batch_size
        else:
            t = type(fields)
            key = (batch_size, fields if t is tuple else tuple(fields) if t is list else fields_key(fields))
        lim = self._limiter
        try:
            ring = self._local.rings[key]
        except (AttributeError, KeyError, TypeError):
            names = None if fields is None else self._check_fields(fields, key[1])
            if batch_size > self.capacity:  # rows may still come: refused only if they never can
                raise ValueError(f"batch_size {batch_size} is larger than the capacity "
                                 f"{self.capacity}; sampling needs batch_size <= len(buffer)")
            self._check_limited(batch_size)
            ring = self._new_ring(batch_size, fields=names, key=key)
        writer = self._writer
        lock = self._lock
        lock.__enter__()
        try:
            lim.sample_wait(batch_size, self._held, self.num_envs)
            n = writer.size
            i = ring.next
            out, arrays = ring.slots[i], ring.arrays[i]
            self.sampler.sample(n, out, arrays[0])
            ring.next = (i + 1) % len(ring.slots)  # a sampler that refused took no slot
            transforms = ring.transforms
            if transforms:
                rows, cursor = out.indices, writer.cursor
                for t, a in zip(transforms, arrays[1:]):
                    rows = t.apply(out, a, rows, cursor)
            if self._spill is not None:
                self._spill.after_sample()
            lim.sampled(batch_size)
            position = writer.laps * writer.capacity + writer.cursor  # (writer.position, inline)
        finally:
            lock.__exit__(None, None, None)
        batch = ring.batches[i]
        if getrefcount(batch) > UNHELD:  # see sample()
            batch = ring.batches[i] = retire(batch)
        batch.write_position = position
        return batch.copy() if copy else batch

    def _check_limited(self, batch_size: int) -> None:
        """Refuse a limited sample of ``batch_size`` rows that could wait for ever (before its
        ring is built): the limiter's own bound, then the sampler's with the limiter (the table
        of :mod:`tfdata.replay.combinations`)."""
        self._limiter.check_sample(batch_size)
        why = combinations.sample_refusal(self.sampler.facets(), self._limiter.params(),
                                          self.capacity, batch_size)
        if why is not None:
            raise ValueError(why)

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
        if not getattr(self.sampler, "stream_order", True):  # before the episodes' absence, which it causes
            raise NotImplementedError(
                f"sample_sequences: sampler={sampler_name(self.sampler)!r} "
                f"writes rows off stream order and delivers rows, not slices; use sample()")
        ep = self._episodes
        if ep is None:
            raise SpecError("sample_sequences needs episode boundaries: the spec must have bool "
                            "fields 'terminated' and 'truncated' (or name them with roles=)")
        if policy not in ("mask", "reject"):
            raise ValueError(f"policy must be 'mask' or 'reject', got {policy!r}")
        batch_size = check_int("batch_size", batch_size, 1)
        length = check_int("length", length, 1)
        reject = policy == "reject"
        names = None if fields is None else self._check_fields(fields)
        lim = self._limiter
        # check, then allocate: a refused call builds no ring
        if lim is None:
            self._check_slices(batch_size, length, reject, self._writer.size)
        else:  # rows may still come: refused now only what no rows can make possible
            self._check_slices(batch_size, length, False, self.capacity)
            self._check_limited(batch_size)
        key = ("seq", batch_size, length) if names is None else ("seq", batch_size, length, names)
        try:
            ring = self._local.rings[key]
        except (AttributeError, KeyError):
            ring = self._new_ring(batch_size, length, names)
        with self._lock:
            if lim is not None:
                lim.sample_wait(batch_size, self._held, self.num_envs)
            n = self._writer.size
            self._check_slices(batch_size, length, reject, n)  # a clear() may have run since
            i = ring.next
            out, arrays = ring.slots[i], ring.arrays[i]
            state = self.sampler.state
            counter = int(state[1])
            failed = self.sampler.sample_slices(n, self._writer.cursor, ep.episode, reject,
                                                MAX_DRAWS, out, arrays[0])
            if failed >= 0:
                state[1] = counter  # a refused sample consumes no randomness
                raise ValueError(f"policy='reject': {MAX_DRAWS} random starts found no slice of "
                                 f"{length} steps within one episode; episodes held are shorter "
                                 f"than that (use policy='mask')")
            ring.next = (i + 1) % len(ring.slots)
            out.source.gather(out.indices, out)
            cursor = self._writer.cursor
            for t, a in zip(ring.transforms, arrays[1:]):
                if t.on_slices:
                    t.apply(out, a, out.indices, cursor)
            if self._spill is not None:
                self._spill.after_sample()
            if lim is not None:
                lim.sampled(batch_size)
        batch = ring.batches[i]
        if getrefcount(batch) > UNHELD:  # see sample()
            batch = ring.batches[i] = retire(batch)
        return batch.copy() if copy else batch

    def _check_slices(self, batch_size: int, length: int, reject: bool, n: int) -> None:
        """Refuse slice sizes the rows ``n`` held cannot back (before anything is allocated)."""
        if n == 0:
            raise ValueError("cannot sample from an empty buffer")
        if batch_size > n:
            raise ValueError(f"batch_size {batch_size} is larger than the {n} rows held; slices "
                             f"start at rows the sampler draws ({self.sampler.rule}), and a "
                             f"batch needs batch_size <= len(buffer)")
        steps = self.capacity // self.num_envs
        if length > steps:
            raise ValueError(f"length {length} is longer than any slice can be: the buffer keeps "
                             f"at most {steps} steps per stream (capacity {self.capacity}, num_envs "
                             f"{self.num_envs})")
        steps = n // self.num_envs
        if reject and length > steps:
            raise ValueError(f"no slice of length {length} exists: the buffer holds {steps} "
                             f"steps per stream")

    def _check_fields(self, fields, as_tuple=None) -> tuple:
        """``fields`` checked (SpecError naming the problem), in spec order; ``as_tuple``: the
        same fields already made a tuple (a generator can be read only once), None if they
        could not be."""
        if not self.sampler.projects:
            raise NotImplementedError(f"fields=: {type(self.sampler).__name__} does not gather "
                                      f"projected outputs (its 'projects' is False: see "
                                      f"tfdata.replay.samplers)")
        return self.spec.select(fields if as_tuple is None else as_tuple)

    def _new_ring(self, batch_size, length: int | None = None, fields=None, key=None) -> OutputRing:
        """The output ring of this thread for ``batch_size`` rows (``length``: slices), of every
        field or of ``fields`` (checked, in spec order); also found under ``key`` from now on."""
        batch_size = check_int("batch_size", batch_size, 1)
        rings = getattr(self._local, "rings", None)
        if rings is None:
            rings = self._local.rings = {}
        own = batch_size if length is None else ("seq", batch_size, length)
        if fields is not None:
            own = (batch_size, fields) if length is None else own + (fields,)
            ring = rings.get(own)  # the same fields, asked for in another order or container
            if ring is not None:
                if key is not None:
                    rings[key] = ring
                return ring
        if self.memory_budget is not None:  # refuse before allocating the ring
            parts = self.nbytes_parts
            parts["new output ring"] = self._ring_size * self._planned_ring(batch_size, length, fields)
            self._check_budget(parts, f"sampling batches of {batch_size}"
                               + (f" slices of {length} rows" if length else " rows")
                               + (f" of fields {list(fields)}" if fields is not None else ""),
                               locked=False)
        if fields is None and not self._stacked:
            source, transforms, names = self._storage, self._transforms, self.spec.names
        else:
            # the stored fields through a projection of the storage (never a stacked field's
            # frames: FrameStack rebuilds its stacks); elided ones by ElideNext
            names = self.spec.names if fields is None else fields
            source = self._storage.project([n for n in names if n in self._stored
                                            and n not in self._stacked])
            transforms = (self._transforms if fields is None
                          else [t.project(fields) for t in self._transforms])
        ring = rings[own] = OutputRing(source, batch_size, self._ring_size, length,
                                       [self.sampler, *transforms], names)
        if key is not None:
            rings[key] = ring
        self._rings.add(ring)
        return ring

    def _short(self, batch_size: int) -> bool:
        """Whether a batch of ``batch_size`` rows, more than the rows held, is refused now: always,
        unless the sampler waits for rows (``waits_for_rows``, exactly-k with a timeout), which
        it does up to its timeout as long as the capacity can hold the batch."""
        return not self.sampler.waits_for_rows or batch_size > self.capacity

    def _too_few_rows(self, batch_size: int, n: int) -> str:
        """Why ``sample(batch_size)`` is refused with ``n`` rows held; the sampler says how it
        takes rows (its ``rule``), the buffer does not guess it from the sampler's type."""
        rule = self.sampler.rule
        if self.sampler.waits_for_rows:  # refused only beyond the capacity (see _short)
            return (f"batch_size {batch_size} is larger than the capacity {self.capacity}: no "
                    f"wait for writers can give a batch that many rows ({rule})")
        if n == 0:
            return f"cannot sample from an empty buffer ({rule})"
        return (f"batch_size {batch_size} is larger than the {n} rows held; {rule}, and a batch "
                f"needs batch_size <= len(buffer)")

    # -- columns ----------------------------------------------------------------------------
    @property
    def stats_fields(self) -> tuple:
        """The fields whose running statistics this buffer keeps (``stats=`` at construction)."""
        return self._stats_fields

    def _stored_field(self, name, what: str):
        """The field ``name``, which the storage must hold (SpecError naming it otherwise)."""
        if not isinstance(name, str) or name not in self.spec:
            raise SpecError(f"{what}: {self.spec.unknown_message(name)}")
        if name not in self._stored:
            src = self.next_of.get(name)
            if src in self._stacked:
                raise SpecError(f"{what}: field {name!r} is not stored: with frame_stack it is rebuilt "
                                f"from the frames of {src!r}")
            raise SpecError(f"{what}: field {name!r} is not stored: with elide_next=True it is read "
                            f"from the next row's {src!r}")
        return self._stored[name]

    def column(self, name: str) -> Column:
        """Read-only views of field ``name`` over the rows held, oldest to newest; no copy.

        Returns
        -------
        Column
            ``column.segments``: one view ``(len(self), *shape)``, or two when the ring has
            wrapped and the oldest row is not in slot 0 (slots ``cursor..capacity``, then
            ``0..cursor``), none when empty; ``np.asarray(column)`` concatenates them (a copy).
            The views read the buffer's memory as it is: rows written or relabelled later
            change them (see :class:`~tfdata.replay.columns.Column`).

            A field stacked with ``frame_stack`` gives what is stored: each row's newest frame,
            shape ``(len(self), *frame)`` (``batch[name][:, -1]`` of the rows), not the stacks.

        Raises
        ------
        SpecError
            Unknown field, or a next field that is not stored (``elide_next``, or the next
            field of a stacked field).
        """
        f = self._stored_field(name, "column")
        with self._lock:
            n, c = self._writer.size, self._writer.cursor
            view = self._storage.field(name)
            if n == 0:
                segments = ()
            elif n < self.capacity or c == 0:
                segments = (view[:n],)
            else:
                segments = (view[c:], view[:c])
        return Column(name, segments, f)

    def column_stats(self, name: str):
        """Statistics of field ``name`` over the rows held, computed now by one compiled pass.

        Any bool, integer or float field; O(len(self)) (a million CartPole rewards: about
        0.25 ms in SoA, 2 ms in AoS, whose records are strided). For statistics kept up to
        date as rows are written, build the buffer with ``stats=[name]`` and call :meth:`stats`.

        Returns
        -------
        FieldStats
            ``count``, and per element (arrays of the field's shape, float64) ``mean``, ``var``
            (population), ``std``, ``min``, ``max``; see
            :class:`~tfdata.replay.columns.FieldStats`. A field stacked with ``frame_stack``:
            the statistics of its stored frames (each row's newest), of the frame's shape.

        Raises
        ------
        SpecError
            Unknown or unstored field, or one of a complex dtype.
        """
        f = self._stored_field(name, "column_stats")
        if f.dtype.kind not in "biuf":
            raise SpecError(f"column_stats: field {name!r} has dtype {f.dtype}; statistics are "
                            f"computed for bool, integer and float fields only")
        with self._lock:
            return scan(f, self._storage.column(name), self._writer.size)

    def stats(self, name: str):
        """The running statistics of field ``name`` over the rows held (``stats=`` at construction).

        Exact for the live rows: rows overwritten have left them, relabelled rows count with
        their new values. The work is done here, under the lock, not when rows are written: a
        call recomputes the blocks of rows written or relabelled since the previous call (256
        rows per block; 1024 for 1-byte fields) and the tree above them, so it costs in
        proportion to the rows written since (at 1M CartPole rows, ``obs`` and ``reward`` kept:
        about 5 us after a push, 10-14 us after an extend of 1000 rows, 0.5 us when nothing
        changed, which returns the same object).

        Returns
        -------
        FieldStats
            ``count == len(self)``, and per element (arrays of the field's shape, float64)
            ``mean``, ``var`` (population, ``ddof=0``), ``std``, ``min``, ``max``, with
            :meth:`~tfdata.replay.columns.FieldStats.normalize`. Read-only.

        Raises
        ------
        SpecError
            ``name`` is not one of :attr:`stats_fields`.
        """
        if self._stats is None or name not in self._stats.trees:
            raise SpecError(f"stats: no running statistics of field {name!r} (kept for "
                            f"{list(self._stats_fields)}): build the buffer with stats=[{name!r}, ...], "
                            f"or compute them once with column_stats({name!r})")
        with self._lock:
            return self._stats.read(name)

    def update_field(self, name: str, indices, values) -> None:
        """Rewrite field ``name`` of the rows in slots ``indices`` in place (relabelling).

        Validated as :meth:`extend` validates, all before anything is written, under the
        buffer's lock; running statistics of the field then count the new values. Sampling
        weights, priorities and write versions are not touched: the rows keep their identity.

        Parameters
        ----------
        name : str
            A stored field. Refused: the ``terminated`` / ``truncated`` fields of a buffer that
            tracks episodes (they define its episode numbers, which slices and n-step windows
            read); with ``elide_next``, an elided next field (not stored) and the field it is
            read from (``obs``: rewriting it would change the previous row's ``next_obs``);
            with ``frame_stack``, a stacked field (its frames make the next rows' stacks) and
            its next field (not stored).
        indices : Batch or array_like of int, shape (k,)
            A batch from :meth:`sample` (recommended): its rows, and the rows it sampled only,
            since a row overwritten after the sample is refused (as ``update_priorities``
            refuses a stale batch); or slots of live rows, as in ``batch.indices``, which
            relabel whatever rows those slots hold now. Either way each in ``[0, len(self))``,
            each once (a batch drawn with replacement that holds a row twice is refused as such
            indices are).
        values : array_like, shape ``(k, *spec[name].shape)``
            Cast to the field's dtype only when no data can be lost (see :class:`Spec`).

        Raises
        ------
        SpecError
            Unknown or refused field (see ``name``), indices not a 1-D integer array, values of
            the wrong shape or an unsafe cast (a ValueError).
        IndexError
            An index outside ``[0, len(self))`` (the message names it and its position).
        ValueError
            An index given twice (the message names it and both positions); a stale batch: rows
            of it were overwritten since it was sampled (the message gives how many), by the
            writer's position the batch keeps (``batch.write_position``; see
            :meth:`tfdata.replay.writers.RingWriter.overwritten`: in ring order a slot is
            overwritten once the writer has passed it, with exactly-k once its sweep wrote it);
            a batch that carries no write position (not from :meth:`sample`) or one ahead of
            this buffer's (another buffer's).
        tfdata.StaleBatchError
            ``indices`` is a batch whose ring slot was reused by a later sample (a ValueError).

        Whatever is refused, nothing has changed.
        """
        f = self._stored_field(name, "update_field")
        if self._episodes is not None and name in (self._roles.get("terminated"),
                                                   self._roles.get("truncated")):
            raise SpecError(f"update_field: field {name!r} is an episode flag of this buffer: episode "
                            f"numbers (slices, n-step windows, elision) are derived from it, so it "
                            f"cannot be rewritten in place")
        if name in self._stacked:
            raise SpecError(f"update_field: field {name!r} is stored one frame per row with "
                            f"frame_stack: the stacks of the stream's next rows are rebuilt from "
                            f"its frames, so it cannot be rewritten in place")
        if name in self._elided.values():
            nxt = [k for k, v in self.next_of.items() if v == name]
            raise SpecError(f"update_field: field {name!r} cannot be rewritten with elide_next=True: "
                            f"the {nxt[0]!r} of each stream's previous row is read from it")
        since = None
        if isinstance(indices, Batch):
            indices, since = self._batch_rows(indices)
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise SpecError(f"update_field: indices must be a 1-D integer array, got "
                            f"{idx.dtype}{list(idx.shape)}")
        slots = self._checked_slots(idx, self._writer.size)
        vals = f.coerce(values, (slots.shape[0],))
        if slots.size == 0:
            return
        with self._lock:
            n = self._writer.size
            if n < self.capacity and int(slots.max()) >= n:  # a clear() ran since the check
                self._checked_slots(idx, n)
            if since is not None:
                self._check_fresh(slots, since)
            self._storage.field(name)[slots] = vals
            if self._stats is not None:
                self._stats.mark(name, slots)
            if self._spill is not None:
                self._spill.check_resident()

    @staticmethod
    def _batch_rows(batch: Batch) -> tuple:
        """``(indices, write position)`` of a batch given to :meth:`update_field` (a retired
        batch raises StaleBatchError here); ValueError for one that carries no position."""
        indices, since = batch.indices, batch.write_position
        if since is None or isinstance(since, bool) or not isinstance(since, (int, np.integer)):
            raise ValueError(f"update_field: this batch carries no write position "
                             f"({since!r:.40}): it did not come from this buffer's sample() (a "
                             f"batch of sample_sequences(), of a shared buffer, or built by hand), "
                             f"so whether its rows are still held cannot be told; pass its indices "
                             f"to relabel whatever rows those slots hold now")
        return indices, int(since)

    def _check_fresh(self, slots: np.ndarray, since: int) -> None:
        """ValueError unless every row of ``slots`` is the one a batch sampled at write position
        ``since`` took (none written since; lock held)."""
        w = self._writer
        if since > w.position:
            raise ValueError(f"update_field: this batch's write position {since} is ahead of this "
                             f"buffer's ({w.position}): it was sampled from another buffer")
        stale = w.overwritten(slots, since)
        k = int(np.count_nonzero(stale))
        if k:
            shown = slots[stale][:10].tolist()
            raise ValueError(f"update_field: stale batch: {k} of its {slots.shape[0]} rows were "
                             f"overwritten since it was sampled (slots {shown}"
                             f"{', ...' if k > 10 else ''}); nothing was written (relabel its other "
                             f"rows with their indices, or sample again)")

    def _checked_slots(self, idx: np.ndarray, n: int) -> np.ndarray:
        """``idx`` (a 1-D integer array) as int64 slots, each in ``[0, n)`` and given once;
        IndexError or ValueError naming the first that is not, and its position."""
        problem, slots = bad_slot(idx, n)
        if problem is not None:
            i, kind = problem
            if kind == "range":
                raise IndexError(f"update_field: indices[{i}] = {idx[i]} is not a live row: slots "
                                 f"are in [0, {n}) (len(buffer) = {n})")
            first = int(np.flatnonzero(slots[:i] == slots[i])[0])
            raise ValueError(f"update_field: index {idx[i]} is given twice (indices[{first}] and "
                             f"indices[{i}]); each row may be rewritten once per call")
        return slots

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue exactly: spec, writer, sampler and a copy of the rows
        (and, with ``stats=``, each field's statistics under ``"stats"``: count, and mean, var,
        min, max as float64 arrays of the field's shape; a load checks them against the rows).

        The rows are layout-neutral (one array per field, ``(len(self), *shape)`` in slot order),
        so a state saved from one layout loads into the other. Plain Python and numpy objects
        only: no pickle is needed to store it.
        """
        with self._lock:
            return self._state(copy=True)

    @contextlib.contextmanager
    def snapshot(self):
        """Hold the lock and yield the state dict as views of the live arrays (what a checkpoint
        writes; valid only inside the ``with``)."""
        with self._lock:
            yield self._state(copy=False)

    def _state(self, copy: bool) -> dict:
        size = self._writer.size
        state = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "spec": self.spec.to_dict(),
            "capacity": self.capacity,
            "layout": self.layout,
            "writer": self._writer.state_dict(),
            "sampler": self.sampler.state_dict(),
            "data": self._storage.state_dict(size, copy),
            "num_envs": self.num_envs,
            "episodes": None if self._episodes is None else self._episodes.state_dict(size, copy),
        }
        if self._frame_stacks is not None:
            state["frames"] = self._frame_stacks.state_dict(size, copy)
        state.update(self.sampler.extra_state(copy, size))
        if self._stats is not None:
            state["stats"] = self._stats.state_dict()
        if self._limiter is not None:
            state["rate_limiter"] = self._limiter.state_dict()
        return state

    @property
    def config(self) -> dict:
        """The constructor's keyword arguments that rebuild this buffer (what a checkpoint keeps;
        ``stats`` only when statistics are kept, so a checkpoint without them is what it was
        before they existed)."""
        config = {"capacity": self.capacity, "layout": self.layout, "ring_size": self._ring_size,
                  "num_envs": self.num_envs, "n_step": self.n_step, "gamma": self.gamma,
                  "next_of": dict(self.next_of), "elide_next": self.elide_next,
                  "roles": dict(self._roles)}
        if self._stats_fields:
            config["stats"] = list(self._stats_fields)
        if self._frames is not None:
            config["frame_stack"] = dict(self._frames["stacks"])
            config["frame_padding"] = padding_config(self._frames)
        if self._limiter is not None:  # its parameters; the counts are in the state
            config["rate_limiter"] = self._limiter.params()
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
    def load(cls, path, **spill):
        """Rebuild a buffer saved with :meth:`save`; it continues exactly where it stopped.

        ``ReplayBuffer.load`` returns whichever buffer class was saved (``ReplayBuffer`` or
        ``PrioritizedReplayBuffer``); ``PrioritizedReplayBuffer.load`` insists on that class.
        ``spill_path=`` with ``hot_rows=`` or ``hot_bytes=`` rebuilds it as a spilling buffer
        (a checkpoint does not record where, or whether, a buffer spilled); ``stats=`` keeps
        running statistics of other fields than the checkpoint's (computed from the rows: a
        checkpoint written before statistics existed can have them so);
        ``layout=`` rebuilds it in another layout (the same samples).
        """
        from .checkpoint import load

        # a checkpoint of another class is refused before anything is built
        return load(path, planning.buffer_classes(ReplayCore), want=cls, **spill)

    def _check_sampler_part(self, state: Mapping) -> None:
        """ValueError unless the sampler part of ``state`` (its keys beyond :data:`STATE_KEYS`)
        is exactly this buffer's sampler's (its ``state_key``, or none for a sampler with
        nothing beyond its RNG): a sampler never sees another sampler's state, which it would
        drop (an exactly-k pool loaded by a uniform buffer: rows delivered sampled again) or
        misread. The message names both samplers."""
        own = self.sampler.state_key
        parts = [k for k in state if k not in STATE_KEYS]
        if parts == ([own] if own else []):
            return
        mine = sampler_name(self.sampler)
        if not parts:
            saved, what = "uniform", "no sampler state beyond the RNG"
        elif len(parts) == 1:
            saved, what = str(parts[0])[:60], f"its {str(parts[0])[:60]!r} entry"
        else:
            saved = " and ".join(repr(str(p)[:60]) for p in parts[:4])
            what = "entries of several samplers"
        hint = (f"build a PrioritizedReplayBuffer" if saved == "prioritized"
                else f"build the buffer with sampler={saved!r}")
        raise ValueError(f"sampler state: this state was saved by a buffer sampling with {saved!r} "
                         f"({what}), but this buffer samples with {mine!r}"
                         + (f" (its {own!r} entry is missing)" if own and own not in parts else "")
                         + f": a sampler's state loads only into the same sampler (another would "
                         f"drop or misread it, e.g. sample again rows already delivered); {hint} "
                         f"to load it")

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
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a {STATE_FORMAT} state dict")
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported state version {state.get('version')!r} "
                             f"(this tfdata reads version {STATE_VERSION})")
        spec = Spec.from_dict(state["spec"])
        if spec != self.spec:
            raise SpecError(f"state spec {spec} differs from this buffer's spec {self.spec}")
        if state["capacity"] != self.capacity:
            raise ValueError(f"state capacity {state['capacity']} differs from this buffer's "
                             f"capacity {self.capacity}")
        if state.get("num_envs", 1) != self.num_envs:
            raise ValueError(f"state num_envs {state.get('num_envs')} differs from this buffer's "
                             f"{self.num_envs}")
        self._check_sampler_part(state)
        writer = RingWriter(self.capacity, self.num_envs)
        writer.load_state_dict(state["writer"])
        size = writer.size
        sampler = self.sampler.check_state(state, size)
        data = state["data"]
        for f in self._storage.spec:
            arr = data.get(f.name) if isinstance(data, Mapping) else None
            if not isinstance(arr, np.ndarray):
                raise SpecError(f"state data: field {f.name!r} missing or not an ndarray")
            if arr.shape != (size,) + f.shape or arr.dtype != f.dtype:
                raise SpecError(f"state data: field {f.name!r}: expected {f.dtype}{(size,) + f.shape}, "
                                f"got {arr.dtype}{arr.shape}")
        episodes = None
        if self._episodes is not None:
            episodes = self._episodes.check_state(state.get("episodes"), size)
        frames = None
        if self._frame_stacks is not None:  # its counters against the writer's and the rows'
            ends = None
            if size:  # whether each stream's newest row ended an episode (num_envs reads)
                newest = (writer.cursor - self.num_envs + np.arange(self.num_envs)) % self.capacity
                ends = (data[self._roles["terminated"]][newest]
                        | data[self._roles["truncated"]][newest])
            frames = self._frame_stacks.check_state(state.get("frames"), size, writer.cursor, ends)
        if self._stats is not None:  # against the state's rows: a refused state changes nothing
            self._stats.check_state(state.get("stats"), size, data)
        counts = None
        if self._limiter is not None:
            counts = self._limiter_counts(state.get("rate_limiter"), size)
        with self._lock:
            if counts is not None:
                self._limiter.load_state(counts)
            self._storage.load_state_dict(data, size, release, records)
            self._writer.load_state_dict(writer.state_dict())
            self.sampler.load_state(sampler)
            if episodes is not None:
                self._episodes.load_state(episodes, size)
            if frames is not None:
                self._frame_stacks.load_state(frames, size)
            for c in self._cold.values():  # compressed from the rows just loaded
                c.rebuild(self._writer.cursor, size)
            if self._stats is not None:
                self._stats.rebuild()  # from the rows just loaded
