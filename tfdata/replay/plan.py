"""The plan of a replay buffer: its options checked once, and what they make it hold.

A :class:`Plan` is built from a buffer's constructor options before anything is allocated.
It checks every option alone and against the others (the table of
:mod:`tfdata.replay.combinations`), derives what the storage holds (next fields elided or
rebuilt left out, stacked fields one frame wide, the storage's layout of them), and counts the
bytes each part will hold. :class:`~tfdata.replay.core.ReplayCore` builds its parts from a
plan; ``plan_memory``, ``plan_storage`` and ``max_capacity`` stop at the plan.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from .._budget import parse_bytes
from .._checks import check_int
from ..spec import Spec
from ..transforms import Context, check_transforms
from ..storage import isolate_layout, output_nbytes, resolve_layout, restrict_layout, storage_nbytes
from . import combinations
from .columns import check_stats_fields, stats_nbytes
from .episodes import Episodes, stored_spec
from .frames import FrameStack, FrameStacks, frame_spec, padding_config, resolve_frames
from .limiter import RateLimiter
from .planning import MAX_CAPACITY
from .transforms import ElideNext, NStep, episode_options
from .writers import writer_for

#: the constructor's arguments that change what a buffer holds (see ReplayCore.plan_memory)
CONFIG_DEFAULTS = dict(layout=None, ring_size=2, num_envs=1, n_step=None, gamma=0.99,
                       next_of="auto", elide_next=False, roles=None, spill_path=None,
                       hot_rows=None, hot_bytes=None, stats=None, frame_stack=None,
                       frame_padding="reset", compress_cold=False, transforms=None)


def min_capacity(spec, **options) -> int:
    """The smallest capacity a buffer of these options can have: ``num_envs`` rows, or with
    ``frame_stack`` a stack of frames per stream (``max(K) * num_envs``). Checks nothing else."""
    envs = check_int("num_envs", options.get("num_envs", 1), 1)
    fs = options.get("frame_stack")
    if fs is None:
        return envs
    ks = fs.values() if isinstance(fs, Mapping) else [fs]
    return envs * max([int(k) for k in ks if isinstance(k, (int, np.integer))] or [1])


class Plan:
    """The checked options of a buffer and what they make it hold; allocates nothing.

    Parameters
    ----------
    owner : str
        The buffer class's name, for messages and the table of combinations.
    spec, capacity, sampler
        As given to the buffer (``sampler``: the sampler object, unbound).
    rate_limiter : RateLimiter or None
        Only its parameters matter here (whether it combines with the other options).
    **options
        The keys of :data:`CONFIG_DEFAULTS`.

    Attributes
    ----------
    stored : Spec
        The fields the storage holds.
    stored_layout
        The storage's layout of them (a stacked field's frames in a column of their own).
    frames : dict or None
        The resolved frame stacks (``stacks``, ``padding``, ...).
    elided : dict
        ``{next field: field}`` of the next fields not stored (elided, or rebuilt from frames).
    tracks_episodes : bool
        Episode numbers are kept: the spec has the flags and the sampler keeps stream order.
    """

    def __init__(self, owner: str, spec, capacity, sampler, *, rate_limiter=None, **options):
        bad = set(options) - set(CONFIG_DEFAULTS)
        if bad:
            raise TypeError(f"unexpected keyword(s) {sorted(bad)}; allowed: {sorted(CONFIG_DEFAULTS)}")
        o = {**CONFIG_DEFAULTS, **options}
        self.owner, self.sampler = owner, sampler
        self.spec = spec if isinstance(spec, Spec) else Spec(spec)
        capacity = check_int("capacity", capacity, 1, MAX_CAPACITY)
        self.ring_size = check_int("ring_size", o["ring_size"], 1)
        self.num_envs = check_int("num_envs", o["num_envs"], 1)
        if capacity % self.num_envs:
            lo = capacity - capacity % self.num_envs
            raise ValueError(f"capacity must be a multiple of num_envs={self.num_envs} (streams are "
                             f"interleaved step by step), got {capacity}; use {lo or self.num_envs} or "
                             f"{lo + self.num_envs}")
        self.capacity = capacity
        opts = episode_options(self.spec, o["n_step"], o["gamma"], o["next_of"], o["elide_next"],
                               o["roles"])
        self.n_step, self.gamma, self.next_of, self.elide_next = (
            opts["n_step"], opts["gamma"], opts["next_of"], opts["elide_next"])
        self.roles, self.has_flags = opts["roles"], opts["has_flags"]
        self.frames = resolve_frames(self.spec, o["frame_stack"], o["frame_padding"], self.next_of,
                                     self.has_flags)
        self.stacked = () if self.frames is None else tuple(self.frames["stacks"])
        compress_cold, spill_path, stats = o["compress_cold"], o["spill_path"], o["stats"]
        if not isinstance(compress_cold, (bool, np.bool_)):
            raise TypeError(f"compress_cold must be True or False, got {type(compress_cold).__name__} "
                            f"{compress_cold!r:.100}")
        combinations.check(combinations.facets(
            owner, **sampler.facets(), n_step=self.n_step,
            elide_next=bool(self.elide_next), frame_stack=self.frames is not None,
            compress_cold=bool(compress_cold), spill=spill_path is not None,
            stats=bool(stats),
            rate_limiter=rate_limiter.params() if isinstance(rate_limiter, RateLimiter) else None))
        if self.frames is not None:
            self._check_frames()
        # next fields not stored: every one with elide_next, and those of stacked fields
        elide = self.has_flags and self.elide_next
        self.elided = {n: s for n, s in self.next_of.items() if elide or s in self.stacked}
        self.frame_spec = frame_spec(self.spec, self.frames)
        self.stored = stored_spec(self.frame_spec, self.elided, bool(self.elided))
        self.stats_fields = check_stats_fields(self.spec, self.stored, stats, self.elided,
                                               bool(self.elided))
        self.transforms = check_transforms(o["transforms"], self.transform_context())
        # the layout of the spec's fields (what ``layout`` returns), and of the stored ones
        # (a stacked field's frames in a column of their own)
        self.layout = resolve_layout(o["layout"], self.spec)
        self.stored_layout = isolate_layout(restrict_layout(self.layout, self.stored), self.stored,
                                            self.stacked)
        self.hot_rows = None  # rows kept resident, for a spilling buffer
        self.spill_path = None if spill_path is None else os.fspath(spill_path)
        self.compress_cold = bool(compress_cold)
        hot_rows, hot_bytes = o["hot_rows"], o["hot_bytes"]
        if self.spill_path is None:
            if hot_rows is not None or hot_bytes is not None:
                raise ValueError("hot_rows / hot_bytes need spill_path (the file that holds the cold rows)")
            return
        if (hot_rows is None) == (hot_bytes is None):
            raise ValueError("spill_path needs exactly one of hot_rows= or hot_bytes= (the part kept in RAM)")
        if hot_bytes is not None:
            hot_rows = parse_bytes("hot_bytes", hot_bytes) // self.row_nbytes()
        self.hot_rows = min(check_int("hot_rows", hot_rows, 1), capacity)

    def _check_frames(self) -> None:
        """What frame stacks need of the capacity (what they need of the sampler is in the
        table of combinations)."""
        kmax = max(self.frames["stacks"].values())
        steps = self.capacity // self.num_envs
        if steps < kmax:
            raise ValueError(f"frame_stack: each stream holds capacity / num_envs = {steps} steps, "
                             f"fewer than a stack of {kmax} frames; use a capacity of at least "
                             f"{kmax * self.num_envs}")

    def transform_context(self, stats=None, allocator=None) -> Context:
        """What the sample transforms are checked against (and, given ``stats`` and
        ``allocator``, bound to)."""
        return Context(self.spec, self.roles, self.stats_fields, self.stacked, stats, allocator)

    @property
    def tracks_episodes(self) -> bool:
        """Episode numbers are kept: the spec has the flags and the writer keeps stream order
        (a sampler that places writes off it, exactly-k, has none to number)."""
        return self.has_flags and getattr(self.sampler, "stream_order", True)

    @property
    def plain_elided(self) -> dict:
        """The elided next fields read from the next row (not rebuilt from frames)."""
        return {n: s for n, s in self.elided.items() if s not in self.stacked}

    def row_nbytes(self) -> int:
        return storage_nbytes(self.stored, 1, self.stored_layout)

    def config(self) -> dict:
        """The constructor's keyword arguments that rebuild a buffer of this plan (``stats``,
        ``frame_stack`` only when given, so a checkpoint without them is what it was before
        they existed)."""
        config = {"capacity": self.capacity, "layout": self.layout, "ring_size": self.ring_size,
                  "num_envs": self.num_envs, "n_step": self.n_step, "gamma": self.gamma,
                  "next_of": dict(self.next_of), "elide_next": self.elide_next,
                  "roles": dict(self.roles)}
        if self.stats_fields:
            config["stats"] = list(self.stats_fields)
        if self.frames is not None:
            config["frame_stack"] = dict(self.frames["stacks"])
            config["frame_padding"] = padding_config(self.frames)
        if self.transforms:
            config["transforms"] = [t.config() for t in self.transforms]
        return config

    def storage(self) -> dict:
        """What a buffer of this plan stores (a checkpoint checks its files against this):
        ``stored``, ``layout`` (the storage's), ``episodes`` (``(spec, next_of, elide)`` of the
        episode bookkeeping, or None) and ``frames`` (the resolved frame stacks, or None)."""
        episodes = None
        if self.tracks_episodes:
            episodes = (self.frame_spec, dict(self.elided or self.next_of), bool(self.elided))
        return {"stored": self.stored, "layout": self.stored_layout, "episodes": episodes,
                "frames": self.frames}

    # -- bytes ------------------------------------------------------------------------------
    def parts(self, batch_sizes=(), cold_bound: bool = True) -> dict:
        """Bytes of each part (the keys of ``ReplayCore.nbytes_parts``) with an output ring per
        entry of ``batch_sizes`` (an int, or ``(batch_size, length[, fields])``)."""
        cap = self.capacity
        storage = storage_nbytes(self.stored, cap if self.hot_rows is None else self.hot_rows,
                                 self.stored_layout)
        book = 0
        if self.tracks_episodes:
            book = Episodes.planned_nbytes(self.frame_spec, cap, self.num_envs, self.elided,
                                           bool(self.elided))
            if self.frames is not None:
                book += FrameStacks.planned_nbytes(self.spec, self.frames, cap, self.num_envs)
        rings = sum(self.ring_size * (self.ring_nbytes(*b) if isinstance(b, tuple) else self.ring_nbytes(b))
                    for b in batch_sizes)
        sampler = self.sampler.plan(cap)
        book += writer_for(self.sampler).planned_nbytes(cap)
        trees = sampler["trees"] + stats_nbytes(self.stored, self.stats_fields, cap)
        parts = {"storage": storage, "bookkeeping": book + sampler["bookkeeping"],
                 "trees": trees, "output_rings": rings}
        if self.compress_cold:
            parts["cold"] = self.cold_nbytes(cold_bound)
        return parts

    def cold_nbytes(self, bound: bool) -> int:
        """The cold tiers' tables and caches, plus (``bound``) a bound of their compressed
        blocks: every frame that can be cold, uncompressed."""
        from ..storage.cold import planned_nbytes

        total = 0
        for name, k in self.frames["stacks"].items():
            fixed, most = planned_nbytes(self.capacity, self.hot_rows, self.spec[name].nbytes // k)
            total += fixed + (most if bound else 0)
        return total

    def ring_nbytes(self, batch_size: int, length: int | None = None, fields=None) -> int:
        """Bytes of one slot of an output ring (see :class:`tfdata.batch.OutputRing`); of a
        ring of the fields ``fields`` only, if given."""
        rows = batch_size * (length or 1)
        stored = None
        if fields is not None:
            fields = self.spec.select(fields)
            stored = [n for n in fields if n in self.stored and n not in self.stacked]
        elif self.stacked:
            stored = [n for n in self.stored.names if n not in self.stacked]
        total = (output_nbytes(self.stored, rows, self.stored_layout, stored)
                 + self.sampler.ring_nbytes(batch_size, length))
        if self.has_flags:
            if self.plain_elided:
                total += ElideNext.plan_ring(self.spec, self.plain_elided, rows, fields)
            if self.frames is not None:
                total += FrameStack.plan_ring(self.spec, self.frames, rows, fields)
            if self.n_step is not None:
                total += NStep.plan_ring(rows, length, self.roles, fields)
        if self.transforms:
            ctx = self.transform_context()
            total += sum(t.ring_nbytes(ctx, rows, fields) for t in self.transforms)
        return total
