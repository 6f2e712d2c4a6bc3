"""Building a replay buffer's parts from its plan.

:func:`build` allocates what a :class:`~tfdata.replay.plan.Plan` says (storage, episode
bookkeeping, frame stacks, cold tiers, running statistics), binds the sampler, the writer and
its write hooks, and lists the transforms a sample applies, in order. It returns them as
:class:`Parts`: the one place that decides which parts a buffer has, so the buffer's sample
and write paths call what they are given and never ask which features are on.
"""

from __future__ import annotations

import threading
import weakref

from ..storage import make_storage
from .columns import RunningStats
from .episodes import Episodes
from .frames import FrameStack, FrameStacks
from .samplers import Sampler
from .streams import RingStreams
from .transforms import ElideNext, NStep
from .writers import make_writer


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


class _SpillRelease:
    """A spilling storage's release after each sample, as the last transform (it reads no rows
    and adds nothing to a batch: the sample path has no step of its own for it)."""

    on_slices = True

    def __init__(self, spill):
        self.spill = spill

    def project(self, names) -> "_SpillRelease":
        return self

    def ring_arrays(self, batch_size: int, length, out) -> dict:
        return {}

    def batch_view(self, arrays: dict, fields: dict, attrs: dict) -> None:
        pass

    def apply(self, out, arrays: dict, rows, where):
        self.spill.after_sample()
        return rows


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


class Drawable:
    """The rows a sampler lets a batch draw, as ``size`` (what the rate limiter reads of the
    rows held): for a sampler that holds rows back (:meth:`Sampler.drawable`)."""

    __slots__ = ("sampler", "writer")

    def __init__(self, sampler, writer):
        self.sampler, self.writer = sampler, writer

    @property
    def size(self) -> int:
        return self.sampler.drawable(self.writer.size)


class Parts:
    """A buffer's parts (None where the plan has none).

    Attributes
    ----------
    plan : Plan
    storage, writer, sampler, lock
        Always present.
    episodes : Episodes or None
    frame_stacks : FrameStacks or None
    stats : RunningStats or None
    spill : Spill or None
    cold : dict
        ``{stacked field: ColdFrames}`` (empty without ``compress_cold``).
    streams : RingStreams
        Where each stream's rows are (n-step windows and slices follow them).
    transforms : list
        What a sample applies after the sampler's draw, in order (n-step, elision, frames, and
        last a spilling storage's release).
    sample_transforms : list
        The bound parts of ``transforms=`` (:mod:`tfdata.transforms`), also in ``transforms``.
    held
        What a rate-limited sample waits on: ``.size`` is the rows a batch can draw.
    limiter : RateLimiter or None
        Set by the buffer, which binds it.
    """

    __slots__ = ("plan", "storage", "writer", "sampler", "lock", "episodes", "frame_stacks",
                 "stats", "spill", "cold", "streams", "transforms", "held", "limiter",
                 "sample_transforms")


def build(plan, allocator, budget_room=None, grow_budget=None) -> Parts:
    """Allocate and bind the parts of ``plan`` with ``allocator``.

    ``budget_room()``: bytes a memory budget has left (for compressed cold blocks), or None
    without a budget; ``grow_budget(extra)``: refuses a growth of the episode tables that
    would exceed it. Both must not keep the buffer alive (see :func:`weak_method`).
    """
    p = Parts()
    p.plan, p.sampler, p.cold, p.transforms = plan, plan.sampler, {}, []
    capacity, envs, roles = plan.capacity, plan.num_envs, plan.roles
    p.episodes = None
    if plan.tracks_episodes:
        # (without elision, next_of only names the pairs: n-step's stored next fields)
        p.episodes = Episodes(plan.frame_spec, capacity, envs, roles, plan.elided or plan.next_of,
                              bool(plan.elided), allocator, grow_budget)
    p.frame_stacks = None
    if plan.frames is not None:  # (the plan refused a sampler off stream order)
        p.frame_stacks = FrameStacks(plan.spec, plan.frames, capacity, envs, roles, allocator)
    hooks = []
    p.spill = None
    if plan.spill_path is None:
        p.storage = make_storage(plan.stored, capacity, plan.stored_layout, allocator=allocator)
    else:
        from ..storage.files import map_storage
        from ..storage.spill import Spill

        data, maps = map_storage(plan.spill_path, plan.stored, capacity, plan.stored_layout)
        p.spill = Spill(maps, capacity, plan.hot_rows, plan.row_nbytes())
        p.storage = make_storage(plan.stored, capacity, plan.stored_layout, backing=data,
                                 allocator=allocator)
    p.sampler.bind(p.storage, capacity, envs, allocator)
    if p.sampler.hears_writes:
        hooks.append(p.sampler)
    if p.frame_stacks is not None:
        p.frame_stacks.bind(p.storage)
    if plan.compress_cold:
        from ..storage.cold import ColdFrames

        for name in plan.stacked:
            word, words, off, width = p.frame_stacks.source(name)
            if off != 0 or words.shape[1] != width:  # isolate_layout makes it a column
                raise AssertionError(f"frames of {name!r} are not a column of their own")
            p.cold[name] = ColdFrames(words, plan.hot_rows, allocator, room=budget_room)
        hooks.append(_ColdHook(list(p.cold.values())))
    if p.spill is not None:
        hooks.append(_SpillHook(p.spill))
    p.stats = None
    if plan.stats_fields:  # hears only laps: pushes and extends do no statistics work
        p.stats = RunningStats(plan.stored, plan.stats_fields, capacity, allocator)
        hooks.append(p.stats)
    # a ring writer, or for a sampler that frees slots out of order a free-slot writer
    p.writer = make_writer(p.sampler, capacity, envs, allocator)
    p.writer.bind(plan.spec, p.storage, p.episodes, hooks, p.frame_stacks)
    watch = getattr(p.sampler, "watch", None)
    if watch is not None:  # a sampler that reads the writer's position (without replacement)
        watch(p.writer)
    if p.stats is not None:
        p.stats.bind(p.storage, p.writer)
    p.streams = RingStreams(envs, capacity, p.episodes, p.sampler, p.writer)
    if plan.n_step is not None:
        p.transforms.append(NStep(p.storage, plan.spec, roles, plan.next_of, plan.n_step,
                                  plan.gamma, p.streams, allocator))
    if plan.plain_elided:
        p.transforms.append(ElideNext(p.storage, plan.spec, p.episodes, roles, plan.plain_elided,
                                      envs, capacity, allocator))
    if p.frame_stacks is not None:
        flags = (p.storage.field(roles["terminated"]), p.storage.field(roles["truncated"]))
        p.transforms.append(FrameStack(plan.spec, p.frame_stacks, p.episodes, flags, p.streams,
                                       allocator, p.cold))
    # the user's transforms, after the buffer's own (they see n-step returns, stacks)
    ctx = plan.transform_context(p.stats, allocator)
    p.sample_transforms = [t.bind(ctx) for t in plan.transforms]
    p.transforms.extend(p.sample_transforms)
    if p.spill is not None:  # after every other transform has read its rows
        p.transforms.append(_SpillRelease(p.spill))
    p.lock = threading.Lock()
    use_lock = getattr(p.sampler, "use_lock", None)
    if use_lock is not None:  # a sampler whose writes or samples wait on a condition of it
        use_lock(p.lock)
    # what a limited sample waits for: the rows held (the writer's size, an attribute), or the
    # rows a sampler that holds some back lets a batch draw
    held_back = getattr(type(p.sampler), "drawable", Sampler.drawable) is not Sampler.drawable
    p.held = Drawable(p.sampler, p.writer) if held_back else p.writer
    p.limiter = None
    return p
