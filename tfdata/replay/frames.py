"""Frame stacks stored one frame per row (``frame_stack=``); the design is
docs/design/frames.md.

A buffer built with ``frame_stack={"obs": K}`` (``obs`` of shape ``(K, *frame)``, oldest frame
first, as gymnasium's ``FrameStackObservation`` returns it) stores only the newest frame of each
row's ``obs`` (in a column of its own, in every layout); its next field ``next_obs`` is not
stored: its newest frame is elided as ``elide_next`` elides a next field, the rest is the row's
own stack shifted by one. The kernels of :mod:`tfdata.kernels._frames` rebuild the stacks at
sample time into the output ring; :class:`FrameStack` does it for a ring of streams and for the
shards of a shared region alike (:mod:`tfdata.shared.frames`).

The bookkeeping (:class:`FrameStacks`): ``depth[slot]``, steps since the episode's first row
(at most ``K - 1``; positions before it are padded as ``FrameStackObservation`` pads them:
``frame_padding="reset"``, ``"zero"`` or a frame), and ``hist``, the frames of the ``K - 1``
steps per stream most recently overwritten, which the oldest rows' stacks still reach. A write
whose stacks the stored frames would not rebuild (an episode's first row without the padding,
another row without its stream's previous frames, a ``next_obs`` that is not ``obs`` shifted by
one) is refused with a SpecError naming the row, the field and the position.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping

import numpy as np

from .._checks import expect_array
from ..errors import SpecError
from ..spec import Field, Spec
from ..storage import word_size
from .episodes import as_words
from .fastpush import exact_guard

PADDINGS = ("reset", "zero")
MAX_STACK = 64


def resolve_frames(spec: Spec, frame_stack, frame_padding, next_of: dict, has_flags: bool):
    """Check ``frame_stack`` / ``frame_padding`` against ``spec``; allocates nothing.

    Returns None (no stacks) or ``{"stacks": {field: K}, "next": {field: next field or None},
    "padding": {field: "reset" | "zero" | ndarray of the frame}}``.

    ``frame_stack``: None; an int ``K`` (the field ``obs``); or a mapping ``{field: K}``.
    ``frame_padding``: ``"reset"`` (default), ``"zero"``, a frame (array of the frame's shape,
    for every stacked field), or a mapping ``{field: one of those}``.
    """
    if frame_stack is None:
        if not (isinstance(frame_padding, str) and frame_padding == "reset"):
            raise ValueError("frame_padding is given but frame_stack is None (it pads stacks)")
        return None
    if isinstance(frame_stack, (bool, np.bool_)):
        raise TypeError(f"frame_stack must be None, an int or a mapping {{field: int}}, got {frame_stack!r}")
    if isinstance(frame_stack, (int, np.integer)):
        if "obs" not in spec:
            raise SpecError(f"frame_stack={int(frame_stack)} stacks the field 'obs', which the spec "
                            f"does not have ({list(spec.names)}); name the field: "
                            f"frame_stack={{'<field>': {int(frame_stack)}}}")
        frame_stack = {"obs": int(frame_stack)}
    if not isinstance(frame_stack, Mapping) or not frame_stack:
        raise TypeError(f"frame_stack must be None, an int or a non-empty mapping {{field: int}}, "
                        f"got {type(frame_stack).__name__} {str(frame_stack)[:100]}")
    if not has_flags:
        raise SpecError(f"frame_stack needs episode boundaries: the spec must have bool fields "
                        f"'terminated' and 'truncated' (or name them with roles=), has {list(spec.names)}")
    sources = {v: k for k, v in next_of.items()}
    stacks, nexts = {}, {}
    for name, k in frame_stack.items():
        if not isinstance(name, str) or name not in spec:
            raise SpecError(f"frame_stack: {spec.unknown_message(name)}")
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or not 2 <= k <= MAX_STACK:
            raise ValueError(f"frame_stack[{name!r}]: expected an int in [2, {MAX_STACK}], got {k!r}")
        f = spec[name]
        if len(f.shape) < 2 or f.shape[0] != k:
            raise SpecError(f"frame_stack[{name!r}] = {int(k)}: the field must be a stack of {int(k)} "
                            f"frames, shape ({int(k)}, *frame) with the oldest frame first, got "
                            f"{f.dtype}{list(f.shape)}")
        if name in next_of:
            raise SpecError(f"frame_stack: {name!r} is the next field of {next_of[name]!r}; stack "
                            f"the observation field ({next_of[name]!r}): its next field is rebuilt too")
        stacks[name] = int(k)
        nexts[name] = sources.get(name)
    padding = {}
    for name in stacks:
        p = frame_padding.get(name, "reset") if isinstance(frame_padding, Mapping) else frame_padding
        padding[name] = _padding(spec[name], p)
    if isinstance(frame_padding, Mapping):
        extra = set(frame_padding) - set(stacks)
        if extra:
            raise SpecError(f"frame_padding names {sorted(map(str, extra))[:5]}, which are not "
                            f"stacked (frame_stack: {sorted(stacks)})")
    return {"stacks": stacks, "next": nexts, "padding": padding}


def _padding(field: Field, p):
    if isinstance(p, str):
        if p not in PADDINGS:
            raise ValueError(f"frame_padding for {field.name!r}: expected 'reset', 'zero' or a frame of "
                             f"shape {list(field.shape[1:])}, got {p[:50]!r}")
        return p
    frame = Field(field.name, field.dtype, field.shape[1:])
    if field.dtype.kind not in "biuf":
        raise SpecError(f"frame_padding for {field.name!r}: a padding frame of dtype {field.dtype} "
                        f"cannot be kept in a checkpoint's config (JSON); use 'reset' or 'zero'")
    try:
        arr = np.array(frame.coerce(p), dtype=field.dtype)
    except SpecError as exc:
        raise SpecError(f"frame_padding for {field.name!r}: {exc}") from None
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise ValueError(f"frame_padding for {field.name!r}: the padding frame must be finite "
                         f"(a checkpoint keeps it in JSON, which has no NaN or infinity), got "
                         f"{int((~np.isfinite(arr)).sum())} non-finite value(s)")
    return np.ascontiguousarray(arr)


def frame_spec(spec: Spec, frames) -> Spec:
    """``spec`` with each stacked field (and its next field) one frame wide: what is stored."""
    if frames is None:
        return spec
    wide = set(frames["stacks"]) | {n for n in frames["next"].values() if n is not None}
    return Spec([Field(f.name, f.dtype, f.shape[1:]) if f.name in wide else f for f in spec])


def mode_of(p) -> int:
    from ..kernels._frames import PAD_RESET, PAD_VALUE, PAD_ZERO

    if isinstance(p, str):
        return PAD_RESET if p == "reset" else PAD_ZERO
    return PAD_VALUE


def padding_config(frames) -> dict:
    """``frame_padding`` as JSON can hold it: names, or the frame as nested lists."""
    return {n: (p if isinstance(p, str) else p.tolist()) for n, p in frames["padding"].items()}


def break_message(name: str, kk: int, padding, next_name, num_envs: int, row: int, reason: int,
                  where: str | None = None) -> str:
    """The SpecError message of a write that ``frame_breaks`` refused: ``row`` (of the write,
    ``num_envs`` streams) broke ``reason`` for the stacked field ``name`` of ``kk`` frames.
    ``where``: how to name the row instead (a shard's writer names its shard)."""
    from ..kernels._frames import BREAK_CONTINUITY, BREAK_PADDING

    e = num_envs
    if where is None:
        where = f"row {row} (env {row % e})" if e > 1 else f"row {row}"
    p = padding
    pad = (f"padding_type={p!r}" if isinstance(p, str) else "the frame_padding frame")
    if reason == BREAK_PADDING:
        return (f"{where}: field {name!r} starts an episode (the stream's previous row ended "
                f"one, or it is the stream's first row), so its frames 0..{kk - 2} must be the "
                f"padding of gymnasium's FrameStackObservation with {pad}, and they are not; "
                f"a buffer with frame_stack stores one frame per row and rebuilds the rest "
                f"(a stream must start at an episode's first row)")
    if reason == BREAK_CONTINUITY:
        return (f"{where}: field {name!r}: frames 0..{kk - 2} of the stack differ from the "
                f"newest frames of the stream's previous rows, which did not end an episode; "
                f"with frame_stack the stream must be continuous (mark the previous row "
                f"terminated or truncated)")
    return (f"{where}: field {next_name!r} is not {name!r} shifted by one frame "
            f"(its frames 0..{kk - 2} must be {name!r}'s frames 1..{kk - 1}, as "
            f"FrameStackObservation returns them)")


class FrameStacks:
    """The per-row bookkeeping of stacked fields (see the module docstring).

    Attributes
    ----------
    depth : ndarray of uint8, shape (capacity,)
    hist : dict of ndarray, each of the field's dtype, shape (K - 1, num_envs, *frame)
    prev : ndarray of int16, shape (num_envs,)
        Depth of each stream's newest row; -1 when its next row starts an episode.
    steps : int
        Steps written since the buffer was cleared.
    """

    def __init__(self, spec: Spec, frames: dict, capacity: int, num_envs: int, roles: dict,
                 allocator):
        from .. import kernels

        self.spec, self.frames = spec, frames
        self.capacity, self.num_envs = capacity, num_envs
        self.stacks, self.nexts, self.padding = frames["stacks"], frames["next"], frames["padding"]
        self._k = kernels
        kmax = max(self.stacks.values())
        if capacity // num_envs < kmax:
            raise ValueError(f"frame_stack: each stream holds capacity / num_envs = "
                             f"{capacity // num_envs} steps, fewer than a stack of {kmax} frames; "
                             f"use a capacity of at least {kmax * num_envs}")
        a = allocator
        self.depth = a.zeros(capacity, np.uint8)
        self.prev = a.empty(num_envs, np.int16)
        self.prev[:] = -1
        self._cur = a.zeros(num_envs, np.int16)
        self.steps = 0
        self.hist = {n: a.zeros((k - 1, num_envs) + spec[n].shape[1:], spec[n].dtype)
                     for n, k in self.stacks.items()}
        self.term_i = spec.names.index(roles["terminated"])
        self.trunc_i = spec.names.index(roles["truncated"])
        self._index = {n: spec.names.index(n) for n in spec.names}
        self._pads = {}
        for n, p in self.padding.items():
            f = spec[n]
            frame = np.zeros(f.shape[1:], f.dtype) if isinstance(p, str) else p
            self._pads[n] = a.zeros(frame.shape, f.dtype)
            self._pads[n][...] = frame
        self._src = {}
        self._pending = None

    @staticmethod
    def planned_nbytes(spec: Spec, frames: dict, capacity: int, num_envs: int) -> int:
        total = capacity + 4 * num_envs
        for n, k in frames["stacks"].items():
            frame = spec[n].nbytes // k
            total += (k - 1) * num_envs * frame + frame
        return int(total)

    @property
    def nbytes(self) -> int:
        return int(self.depth.nbytes + self.prev.nbytes + self._cur.nbytes
                   + sum(h.nbytes for h in self.hist.values())
                   + sum(p.nbytes for p in self._pads.values()))

    def bind(self, storage) -> None:
        """The storage whose frame columns the checks and the stacks read."""
        for n in self.stacks:
            fb = self.spec[n].nbytes // self.stacks[n]
            word = word_size(storage.field_offset(n), fb)
            self._src[n] = (word,) + tuple(storage.field_words(n, word))

    def source(self, name: str):
        """``(word, words, offset, width)``: where the stored frames of ``name`` are."""
        return self._src[name]

    def pad_words(self, name: str, word: int) -> np.ndarray:
        return as_words(self._pads[name].reshape(1, -1), word)[0]

    def hist_words(self, name: str, word: int) -> np.ndarray:
        return as_words(self.hist[name], word, 2)

    # -- writing ----------------------------------------------------------------------------
    def check(self, values: list, n: int, cursor: int) -> list:
        """Refuse a write of ``n`` rows (values in the spec's field order, stacks whole) whose
        stacks the stored frames would not rebuild (SpecError; nothing changes). Returns the
        values with each stacked field (and its next field) as its newest frame, what the
        storage and the elision bookkeeping take. Lock held."""
        k = self._k
        e = self.num_envs
        term, trunc = values[self.term_i], values[self.trunc_i]
        out = list(values)
        pending = []
        for name, kk in self.stacks.items():
            word, src, off, width = self._src[name]
            i = self._index[name]
            obs = as_words(np.ascontiguousarray(values[i]), word)
            nxt_name = self.nexts[name]
            if nxt_name is not None:
                j = self._index[nxt_name]
                nxt = as_words(np.ascontiguousarray(values[j]), word)
            else:
                nxt = obs[:0]
            pad = self.pad_words(name, word)
            r = k.frame_breaks(obs, nxt, term, trunc, e, cursor, self.capacity, src, off,
                               self.prev, mode_of(self.padding[name]), pad, self._cur)
            if r >= 0:
                raise SpecError(break_message(name, kk, self.padding[name], nxt_name,
                                              self.num_envs, r // 4, r % 4))
            out[i] = values[i][:, -1]
            if nxt_name is not None:
                out[j] = values[j][:, -1]
            pending.append((name, obs))
        self._pending = (pending, term, trunc)
        return out

    def write(self, n: int, cursor: int, size: int) -> None:
        """After :meth:`check` accepted the write and before the rows are stored: keep the
        frames the write overwrites that held stacks still reach, stamp depths. Lock held."""
        pending, term, trunc = self._pending
        self._pending = None
        k = self._k
        prev = self.prev
        # each call stamps depths and moves prev on capped at its own K - 1: the field of the
        # largest K goes last, so depth and prev keep the cap every stack reads (each kernel
        # caps again at its own K)
        pending = sorted(pending, key=lambda item: self.stacks[item[0]])
        for i, (name, obs) in enumerate(pending):
            word, src, off, width = self._src[name]
            p = prev if i == len(pending) - 1 else prev.copy()
            k.frames_write(obs, term, trunc, self.num_envs, cursor, self.capacity, size, self.steps,
                           src, off, self.hist_words(name, word), p, self.depth)
        self.steps += n // self.num_envs

    def clear(self, wipe: bool = False) -> None:
        self.depth[...] = 0
        self.prev[...] = -1
        self.steps = 0
        if wipe:
            for h in self.hist.values():
                h[...] = 0

    # -- state ------------------------------------------------------------------------------
    def state_dict(self, size: int, copy: bool = True) -> dict:
        c = (lambda a: a.copy()) if copy else (lambda a: a)
        return {"stacks": dict(self.stacks), "steps": int(self.steps), "depth": c(self.depth[:size]),
                "prev": c(self.prev), "hist": {n: c(h) for n, h in self.hist.items()}}

    def check_state(self, state, size: int, cursor: int, ends=None) -> dict:
        """Validate a :meth:`state_dict` (untrusted) for a writer holding ``size`` rows with
        ``cursor`` (both checked); ValueError naming the entry. Dtypes, shapes and ranges (no
        kernel reads outside its arrays whatever they hold), ``steps`` (:func:`steps_message`)
        and the counters (:func:`counters_message`; ``ends``: bool ``(num_envs,)``, whether
        each stream's newest row ended an episode). A checkpoint load also checks every depth
        against the rows' episode ends (:func:`depth_break`)."""
        if not isinstance(state, Mapping):
            raise ValueError("state has no frame-stack bookkeeping ('frames' entry)")
        if state.get("stacks") != self.stacks:
            raise ValueError(f"state frames.stacks {str(state.get('stacks'))[:100]} differs from this "
                             f"buffer's frame_stack {self.stacks}")
        steps = state.get("steps")
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 0 <= steps < 2**62:
            raise ValueError(f"state frames.steps: expected an int in [0, 2**62), got {str(steps)[:50]}")
        want = steps_message(int(steps), size, self.num_envs, self.capacity, cursor)
        if want is not None:
            raise ValueError(f"state frames.steps {steps}: {want}")
        kmax = max(self.stacks.values()) - 1
        depth = state.get("depth")
        expect_array(depth, np.uint8, (size,), "frames.depth")
        if size and int(depth.max()) > kmax:
            raise ValueError(f"state frames.depth: values must be in [0, {kmax}], got {int(depth.max())}")
        prev = state.get("prev")
        expect_array(prev, np.int16, (self.num_envs,), "frames.prev")
        if prev.size and (int(prev.min()) < -1 or int(prev.max()) > kmax):
            raise ValueError(f"state frames.prev: values must be in [-1, {kmax}]")
        bad = counters_message(depth, prev, int(steps), cursor, size, self.num_envs,
                               self.capacity, ends)
        if bad is not None:
            raise ValueError(f"state.frames.{bad}")
        hist = state.get("hist")
        if not isinstance(hist, Mapping) or set(hist) != set(self.hist):
            raise ValueError(f"state frames.hist: expected an entry per stacked field {sorted(self.hist)}")
        for n, h in self.hist.items():
            expect_array(hist[n], h.dtype, h.shape, f"frames.hist[{n!r}]")
        return state

    def load_state(self, state, size: int) -> None:
        self.clear()
        self.depth[:size] = state["depth"]
        self.prev[...] = state["prev"]
        self.steps = int(state["steps"])
        for n, h in self.hist.items():
            h[...] = state["hist"][n]


def steps_message(steps: int, size: int, num_envs: int, capacity: int, cursor: int):
    """Why ``steps`` (steps written since the buffer was cleared) cannot go with ``size`` rows
    held and the writer's ``cursor`` (``size == min(steps * num_envs, capacity)`` and ``cursor
    == steps * num_envs % capacity``), or None."""
    if size == min(steps * num_envs, capacity) and cursor == steps * num_envs % capacity:
        return None
    if size < capacity:
        return (f"expected {size // num_envs} (the rows held, {size}, over num_envs={num_envs}: the "
                f"ring has not wrapped since the buffer was cleared)")
    if steps * num_envs < capacity:
        return (f"expected at least {capacity // num_envs} (the ring is full: capacity {capacity} "
                f"over num_envs={num_envs})")
    lap = capacity // num_envs
    first = (steps // lap) * lap + cursor // num_envs
    near = [t for t in (first - lap, first, first + lap) if t >= lap]
    return (f"expected a count of steps whose rows end at the writer's cursor {cursor}: steps * "
            f"num_envs % capacity == cursor (num_envs={num_envs}, capacity {capacity}), such as "
            f"{' or '.join(map(str, near))}; a stack would take the frames of other steps")


def counters_message(depth, prev, steps: int, cursor: int, size: int, num_envs: int,
                     capacity: int, ends=None):
    """What the frame-stack counters (``depth``, ``prev``; ``steps`` already agrees with the
    writer, :func:`steps_message`) disagree on with the writer's ``cursor`` and ``size``, as
    ``"<entry>[i] = v: expected ..."``, or None. O(size) numpy, without the rows' flags: each
    row's depth is at most its step number since the buffer was cleared (no stack reaches
    before the first step); each stream's ``prev`` is -1 or its newest row's depth (-1 in an
    empty buffer; with ``ends``, bool ``(num_envs,)``, -1 exactly when that row ended an
    episode)."""
    e = num_envs
    if size == 0:
        bad = np.flatnonzero(prev != -1)
        if bad.size:
            i = int(bad[0])
            return f"prev[{i}] = {int(prev[i])}: expected -1 (no row held)"
        return None
    m = size // e
    oldest = 0 if size < capacity else cursor
    slots = np.arange(size, dtype=np.int64)
    step = steps - m + ((slots - oldest) % capacity) // e
    bad = np.flatnonzero(depth.astype(np.int64) > step)
    if bad.size:
        i = int(bad[0])
        return (f"depth[{i}] = {int(depth[i])}: expected at most {int(step[i])}, the row's step "
                f"number since the buffer was cleared (steps {steps}, cursor {cursor})")
    newest = (cursor - e + np.arange(e, dtype=np.int64)) % capacity
    for i in range(e):
        p, d = int(prev[i]), int(depth[newest[i]])
        if ends is not None and bool(ends[i]) != (p == -1):
            want = ("-1 (its newest row ended an episode)" if ends[i]
                    else f"{d}, the depth of its newest row (slot {int(newest[i])})")
            return f"prev[{i}] = {p}: expected {want}"
        if p != -1 and p != d:
            return (f"prev[{i}] = {p}: expected -1 or {d}, the depth of stream {i}'s newest row "
                    f"(slot {int(newest[i])})")
    return None


def depth_break(depth, term, trunc, prev, cursor: int, size: int, num_envs: int, capacity: int,
                steps: int, kmax: int):
    """The first slot whose depth is not what writing the rows held gave (in each stream: 0
    after a row that ended an episode, else the previous row's plus one, at most ``kmax``; the
    oldest row's at most its step number), or ``-1 - e`` for a stream ``e`` whose ``prev`` is
    not its newest row's (its depth, or -1 after an episode's end), or None. Numpy, O(size).

    Parameters
    ----------
    depth : ndarray of uint8, shape (size,)
    term, trunc : ndarray of bool, shape (size,), any stride
    prev : ndarray of int16, shape (num_envs,)
    cursor, size, capacity, steps : int
        The writer's cursor and size (already checked), and the steps written since a clear.
    """
    e = num_envs
    if size == 0:
        bad = np.flatnonzero(prev != -1)
        return -1 - int(bad[0]) if bad.size else None
    m = size // e
    oldest = 0 if size < capacity else cursor
    # each stream's slots, oldest first: (m, e)
    order = (oldest + np.arange(m, dtype=np.int64)[:, None] * e + np.arange(e)) % capacity
    d = depth[order].astype(np.int64)
    ends = np.logical_or(term[order], trunc[order])
    top = min(kmax, steps - m)  # the oldest row's step number
    bad = d[0] > top
    if bad.any():
        return int(order[0, int(np.argmax(bad))])
    t = np.arange(m, dtype=np.int64)[:, None]
    fresh = np.zeros((m, e), bool)
    fresh[1:] = ends[:-1]  # rows that start an episode
    start = np.maximum.accumulate(np.where(fresh, t, -1), axis=0)
    want = np.minimum(np.where(start >= 0, t - start, t + d[0]), kmax)
    bad = (want != d).reshape(-1)
    if bad.any():
        return int(order.reshape(-1)[int(np.argmax(bad))])
    bad = np.where(ends[-1], -1, d[-1]) != prev
    if bad.any():
        return -1 - int(np.argmax(bad))
    return None


class FrameStack:
    """The transform (:mod:`tfdata.replay.transforms`) that fills the stacked fields and their
    next fields of a batch from the stored frames, over a ring of streams (``where``: the
    writer's cursor) or a shared region's shards (``where`` ignored: the buffer then checks the
    stacks, :func:`tfdata.kernels.torn_stacks`).

    ``frames``: the per-slot tables (:class:`FrameStacks`); ``finals``: the next frames the rows
    do not hold (the buffer's ``Episodes``); a region's ``ShardFrames`` is both. ``flags``: the
    stored ``terminated`` and ``truncated`` fields; ``cold``: ``{field: ColdFrames}`` of a ring
    with a compressed cold tier.
    """

    on_slices = True

    def __init__(self, spec: Spec, frames, finals, flags, streams, allocator, cold=None):
        from .. import kernels

        self.k, self.spec, self.frames, self.finals = kernels, spec, frames, finals
        self.flags, self.streams, self.allocator = flags, streams, allocator
        self.kernels = kernels.STACKS_BY_STREAMS[streams.kind]
        self.names = list(frames.stacks)
        self.wanted = None  # every field; a projection sets the names it fills
        self.cold = cold or {}  # (shared by projections)
        # per stacked field, what its kernels read that does not change once built
        self._fields = []
        for name in self.names:
            word, src, off, width = frames.source(name)
            self._fields.append((name, frames.nexts[name], word, src, off,
                                 frames.hist_words(name, word), frames.pad_words(name, word),
                                 mode_of(frames.padding[name])))
        self._shown = set(self.names) | {n for n in frames.nexts.values() if n is not None}
        self._entries = {}  # (kernel, word) -> its specialization for the flags of any stride

    def _flagged(self, kernel, word: int, at: int, args: tuple):
        """``kernel`` (one that reads the flags) as :func:`tfdata.kernels.strided` specializes it
        for ``args``: the flags of any stride (a column, or a field of records), so one
        specialization per word type serves every layout. ``args`` keep their types from call
        to call (the same arrays, or slices of them); the flags are ``args[at:at + 2]``."""
        key = (kernel, word)
        got = self._entries.get(key)
        if got is None:
            got = self._entries[key] = self.k.strided(kernel, args, (at, at + 1))
        return got

    @staticmethod
    def plan_ring(spec: Spec, frames: dict, rows: int, fields=None) -> int:
        """Bytes of the stacks :meth:`ring_arrays` allocates (the streams' marks not counted:
        ``streams.ring_nbytes``)."""
        names = [n for n in frames["stacks"]] + [n for n in frames["next"].values() if n is not None]
        return rows * sum(spec[n].nbytes for n in names if fields is None or n in fields)

    def project(self, names) -> "FrameStack":
        t = copy.copy(self)
        t.wanted = set(names)
        return t

    def _wants(self, name) -> bool:
        return name is not None and (self.wanted is None or name in self.wanted)

    def ring_arrays(self, batch_size: int, length, out) -> dict:
        rows = batch_size * (length or 1)
        arrays, words = {}, {}
        for name, nxt, word, *_ in self._fields:
            for field in (name, nxt):
                if self._wants(field):
                    f = self.spec[field]
                    arrays[field] = self.allocator.zeros((rows,) + f.shape, f.dtype)
                    words[field] = as_words(arrays[field], word)  # what the kernels write
        arrays.update(self.streams.ring_arrays(batch_size, length, out))  # shards: torn marks
        arrays[" words"] = words  # (not a field name: a batch shows the fields only)
        return arrays

    def batch_view(self, arrays: dict, fields: dict, attrs: dict) -> None:
        for name, arr in arrays.items():
            if name in self._shown:
                fields[name] = arr

    def apply(self, out, arrays: dict, rows: np.ndarray, where) -> np.ndarray:
        """Stacks of the rows drawn (``out.indices``); next stacks of ``rows`` (n-step: each
        window's last row)."""
        self._stacks(out.indices, rows, arrays[" words"], where, None)
        return rows

    def apply_row(self, out, arrays: dict, i: int, where, rows=None) -> None:
        """:meth:`apply` for row ``i`` of the batch only (a row drawn again; ``rows``: the slot
        whose next stack it shows, default its own)."""
        one = out.indices[i:i + 1]
        self._stacks(one, one if rows is None else rows, arrays[" words"], where, slice(i, i + 1))

    def _stacks(self, idx, rows, words, where, part) -> None:
        fr, fin, ks = self.frames, self.finals, self.kernels
        geo, steps = self.streams.at(where), fr.steps
        term, trunc = self.flags
        for name, nxt, word, src, off, hist, pad, mode in self._fields:
            if name in self.cold:
                self._apply_cold(self.cold[name], name, idx, rows, words, where, steps, word, src,
                                 off, hist, pad, mode)
                continue
            want_obs, want_next = self._wants(name), self._wants(nxt)
            if want_obs:
                dst = words[name] if part is None else words[name][part]
            if want_next:
                nw = words[nxt] if part is None else words[nxt][part]
                finals, pending = fin.final_words(nxt, word), fin.pending_words(nxt, word)
                if want_obs and rows is idx:
                    # both stacks of the same rows: one pass, the frames read once
                    args = (geo, steps, rows, fr.depth, src, off, hist, pad, mode, term, trunc,
                            fin.final_idx, finals, pending, dst, nw)
                    self._flagged(ks.stack_pairs, word, 9, args)(*args)
                    continue
            if want_obs:
                ks.stacks(geo, steps, idx, fr.depth, src, off, hist, pad, mode, dst)
            if want_next:
                args = (geo, steps, rows, fr.depth, src, off, hist, pad, mode, term, trunc,
                        fin.final_idx, finals, pending, nw)
                self._flagged(ks.next_stacks, word, 9, args)(*args)

    def _apply_cold(self, cold, name, obs_rows, next_rows, words, cursor, steps, word, src, off,
                    hist, pad, mode) -> None:
        """:meth:`apply` for a field with a compressed cold tier (a ring's): list the compressed
        blocks the stacks read, then rebuild the stacks in passes of as many blocks as the
        cache holds (see :mod:`tfdata.kernels._cold`)."""
        from ..kernels._cold import ALL, COLD, LIST

        k, fr, ep = self.k, self.frames, self.finals
        e, cap = self.streams.num_envs, self.streams.capacity
        nxt = fr.nexts[name]
        want_obs, want_next = self._wants(name), self._wants(nxt)
        if not (want_obs or want_next):
            return
        if want_obs:
            obs = words[name]
        if want_next:
            dst = words[nxt]
            finals, pending = ep.final_words(nxt, word), ep.pending_words(nxt, word)
            term, trunc = self.flags
        gen = cold.next_gen()
        m, done, count = LIST, 0, 0
        while True:
            if want_obs:
                got = k.cold_frame_stacks(obs_rows, cursor, steps, e, cap, fr.depth, src, off, hist, pad,
                                          mode, cold.cold_from, cold.block, cold.cache_map, cold.cache,
                                          cold.filled, m, cold.mark, gen, cold.need, cold.reach, count,
                                          obs)
                count = got if m == LIST else count
            if want_next:
                args = (next_rows, cursor, steps, e, cap, fr.depth, src, off, hist, pad, mode, term,
                        trunc, ep.final_idx, finals, pending, cold.cold_from, cold.block,
                        cold.cache_map, cold.cache, cold.filled, m, cold.mark, gen, cold.need,
                        cold.reach, count, dst)
                got = self._flagged(k.cold_next_frame_stacks, word, 11, args)(*args)
                count = got if m == LIST else count
            if m != LIST and done >= count:
                return
            done = cold.load(done, count)  # the next blocks into the cache, then a pass over them
            m = ALL if m == LIST else COLD


def make_push(frames: FrameStacks, spec: Spec, storage, episodes, writer, lock, slow, on_write=None,
              on_wrap=None, gate=None):
    """``push(row)`` for a frame-stacked buffer of one stream whose one stacked field has a next
    field (the Atari case), or None (the generic path then takes every row).

    Guards in Python (exact dtypes and shapes, scalar types that cast without loss, as the
    second tier of :mod:`tfdata.replay.fastpush`), then one compiled call that checks the stacks
    and writes the frame and the bookkeeping (:func:`tfdata.kernels._frames.frame_push`), then
    numpy assignments of the other fields. Anything the call refuses (a broken stream, a full
    final table) goes to ``slow``, which raises the precise error or grows the table.
    """
    if (len(frames.stacks) != 1 or writer.num_envs != 1 or episodes is None
            or set(episodes.next_of) != {n for n in frames.nexts.values() if n is not None}):
        return None
    (name, k), = frames.stacks.items()
    nxt = frames.nexts[name]
    if nxt is None:
        return None
    from .. import kernels

    fb = spec[name].nbytes // k
    # frames compared and copied as words: a byte loop does not vectorise (docs/design/frames.md,
    # "Measured")
    word, src, off, width = frames.source(name)
    if word != 8:  # the compiled push views the stacks as uint64 words
        return None
    stored = storage.spec
    views = dict(zip(stored.names, storage.field_views()))
    ns = {"ndarray": np.ndarray, "slow": slow, "w": writer, "cap": writer.capacity, "fr": frames,
          "ep": episodes, "acquire": lock.acquire, "release": lock.release, "kpush": kernels.frame_push_u8,
          "src": src, "off": off, "hist": frames.hist_words(name, word)[:, 0, :],
          "pad": frames.pad_words(name, word), "mode": mode_of(frames.padding[name]),
          "depth": frames.depth, "prev": frames.prev, "fidx": episodes.final_idx,
          "fin": [None, None], "final_words": episodes.final_words, "WORD": word,
          "pending": episodes.pending_words(nxt, word), "has_pending": episodes.has_pending,
          "episode": episodes.episode, "current": episodes.current, "K": k, "FB": fb, "NXT": nxt,
          "on_write": on_write, "on_wrap": on_wrap, "gate": gate, "dt": spec[name].dtype,
          "sh": spec[name].shape}
    reads, guards, writes = [], [], []
    flags = []
    for i, f in enumerate(spec):
        v = f"v{i}"
        reads.append(f"        {v} = row[{f.name!r}]")
        if f.name in (name, nxt):
            guards.append(f"type({v}) is ndarray and {v}.dtype is dt and {v}.shape == sh "
                          f"and {v}.flags.c_contiguous")
            continue
        if f.name in (frames.spec.names[frames.term_i], frames.spec.names[frames.trunc_i]):
            flags.append(v)
        ns[f"a{i}"] = views[f.name]
        guards.append(exact_guard(f, i, ns))
        writes.append(f"            a{i}[p] = {v}")
    io, inx = spec.names.index(name), spec.names.index(nxt)
    lines = [
        "def push(row):",
        f"    if type(row) is not dict or len(row) != {len(spec)}:",
        "        return slow(row)",
        "    try:",
        *reads,
        "    except KeyError:",
        "        return slow(row)",
        "    if not (" + "\n            and ".join(guards) + "):",
        "        return slow(row)",
        f"    ended = bool({flags[0]}) or bool({flags[1]})",
        "    acquire()",
        "    try:",
        *([] if gate is None else ["        gate(1)"]),
        "        p = w.cursor",
        "        t = ep.finals[NXT]",
        "        if t is not fin[0]:  # the table grew: its words again",
        "            fin[0], fin[1] = t, final_words(NXT, WORD)",
        f"        r = kpush(v{io}, v{inx}, ended, p,",
        "                  w.size, fr.steps, src, off, hist, pad, mode, depth, prev, fidx, fin[1],",
        "                  ep.free, ep.n_free, pending, has_pending, episode, current)",
        "        if r >= 0:",
        "            p = -1",
        "        else:",
        "            ep.n_free = -1 - r",
        "            fr.steps += 1",
        *writes,
        *([] if on_write is None else ["            on_write(p)"]),
        "            if p + 1 != cap:",
        "                w.cursor = ep.stamped = p + 1",
        "            else:",
        *([] if on_wrap is None else ["                on_wrap()"]),
        "                w.cursor = ep.stamped = 0",
        "            if w.size != cap:",
        "                w.size += 1",
        "    finally:",
        "        release()",
        "    if p < 0:  # refused or the final table is full: the generic path says why, or grows it",
        "        return slow(row)",
    ]
    src_code = "\n".join(lines)
    exec(compile(src_code, "<tfdata generated frame push>", "exec"), ns)
    push = ns.pop("push")
    push.__source__ = src_code
    return push


# -- checkpoints, read as untrusted input: ``c`` is the checkpoint's checker of JSON values
# (FormatError naming the file and the field), ``arrays`` its reader of array files (exactly the
# dtype and shape asked for, checked from the header before anything is read)
#: the keys of ``state.frames``
STATE_KEYS = ("stacks", "steps", "depth", "prev", "hist")
#: ``frames.steps`` accepted from a checkpoint (steps written since a clear)
MAX_STEPS = (1 << 62) - 1


def read_config(c, v: dict, spec: Spec) -> None:
    """A checkpoint's ``frame_stack`` (an object of stacked fields to ``K`` in ``[2, 64]``, each
    field of shape ``(K, *frame)``) and ``frame_padding`` (an object with exactly those fields,
    each ``"reset"``, ``"zero"`` or the frame as nested lists): present together."""
    for k in ("frame_stack", "frame_padding"):
        if k not in v:
            c.fail("config." + k, "present (config.frame_stack and config.frame_padding go "
                   "together)", show=False)
    w = "config.frame_stack"
    fs = v["frame_stack"]
    if not isinstance(fs, dict) or not 1 <= len(fs) <= len(spec):
        c.fail(w, f"an object of 1 to {len(spec)} stacked fields {{field: K}}", fs)
    for name, k in fs.items():
        if name not in spec:
            c.fail(f"{w} key", f"a field of the spec {list(spec.names)[:20]}", name)
        where = f"{w}[{name[:40]!r}]"
        c.integer(where, k, 2, MAX_STACK)
        shape = spec[name].shape
        if len(shape) < 2 or shape[0] != k:
            c.fail(where, f"the stack depth of field {name[:40]!r}, whose shape is "
                   f"{list(shape)} (a stacked field has shape (K, *frame))", k)
    pad = c.obj("config.frame_padding", v["frame_padding"], tuple(fs))
    for name in fs:
        p = pad[name]
        where = f"config.frame_padding[{name[:40]!r}]"
        if isinstance(p, str):
            c.choice(where, p, PADDINGS)
        else:
            _read_frame(c, where, p, spec[name])


def _read_frame(c, where: str, v, field: Field) -> None:
    """A padding frame of ``field`` as nested lists: exactly the frame's shape (checked level
    by level before anything is converted) and values of its dtype (a bool field: true or
    false; integers: ints in the dtype's range; floats: finite floats the dtype holds)."""
    shape = field.shape[1:]
    dt = field.dtype
    if dt.kind not in "biuf":
        c.fail(where, f"'reset' or 'zero' (a padding frame of dtype {dt} is not kept)", v)
    level = [v]
    for depth, n in enumerate(shape):
        nxt = []
        for item in level:
            if not isinstance(item, list) or len(item) != n:
                c.fail(where, f"the frame {list(shape)} as nested lists ('reset', 'zero' "
                       f"or a frame); level {depth} must be lists of {n}", item)
            nxt.extend(item)
        level = nxt
    for i, x in enumerate(level):
        if not _fits(x, dt):
            if dt.kind == "b":
                want = "true or false"
            elif dt.kind in "iu":
                want = f"ints in [{np.iinfo(dt).min}, {np.iinfo(dt).max}] ({dt})"
            else:
                want = f"finite floats of at most {float(np.finfo(dt).max)} in magnitude ({dt})"
            c.fail(f"{where} value {i}", want, x)


def _fits(x, dt: np.dtype) -> bool:
    if dt.kind == "b":
        return type(x) is bool
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return type(x) is int and info.min <= x <= info.max
    return type(x) is float and math.isfinite(x) and abs(x) <= float(np.finfo(dt).max)


def read_state(c, arrays, fr, stacks: dict, spec: Spec, envs: int, size: int, cap: int,
               cursor: int) -> dict:
    """The frame-stack bookkeeping of the state: ``stacks`` equal to ``config.frame_stack``;
    ``steps`` consistent with the rows held and the writer's cursor (:func:`steps_message`);
    ``depth`` uint8 ``(size,)`` at most ``max(K) - 1``; ``prev`` int16 ``(num_envs,)`` in ``[-1,
    max(K) - 1]``; ``hist`` per stacked field, of its dtype and shape ``(K - 1, num_envs,
    *frame)``. Checked against the rows' episode ends by :func:`check_order` once they are in
    memory."""
    w = "state.frames."
    c.obj("state.frames", fr, STATE_KEYS)
    if not isinstance(fr["stacks"], dict) or fr["stacks"] != stacks or any(
            type(k) is not int for k in fr["stacks"].values()):
        c.fail(w + "stacks", f"{stacks} (config.frame_stack)", fr["stacks"])
    steps = c.integer(w + "steps", fr["steps"], 0, MAX_STEPS)
    problem = steps_message(steps, size, envs, cap, cursor)
    if problem is not None:
        c.fail(w + "steps", problem[len("expected "):], steps)
    kmax = max(stacks.values()) - 1
    depth = arrays.read(w + "depth", fr["depth"], np.uint8, (size,))
    if size and int(depth.max()) > kmax:
        i = int(np.argmax(depth > kmax))
        c.fail(f"{w}depth[{i}]", f"an int in [0, {kmax}] (steps since the episode's first row, "
               f"at most max(K) - 1)", int(depth[i]))
    prev = arrays.read(w + "prev", fr["prev"], np.int16, (envs,))
    bad = np.flatnonzero((prev < -1) | (prev > kmax))
    if bad.size:
        i = int(bad[0])
        c.fail(f"{w}prev[{i}]", f"an int in [-1, {kmax}]", int(prev[i]))
    table = c.obj(w + "hist", fr["hist"], tuple(stacks))
    hist = {}
    for name, k in stacks.items():
        f = spec[name]
        hist[name] = arrays.read(f"{w}hist[{name[:40]!r}]", table[name], f.dtype,
                                 (k - 1, envs) + f.shape[1:])
    return {"stacks": dict(stacks), "steps": steps, "depth": depth, "prev": prev, "hist": hist}


def check_order(c, frames: dict, term, trunc, cursor: int, size: int, envs: int,
                cap: int) -> None:
    """The depths and ``prev`` of the frame-stack bookkeeping must be what writing the rows held
    gave (see :func:`depth_break`); ``term``, ``trunc``: the loaded flags."""
    kmax = max(frames["stacks"].values()) - 1
    bad = depth_break(frames["depth"], term, trunc, frames["prev"], cursor, size, envs, cap,
                      frames["steps"], kmax)
    if bad is None:
        return
    if bad >= 0:
        c.fail(f"state.frames.depth[{bad}]", "each row's steps since its episode's first row (0 "
               "after a row that ended an episode, else the previous row's plus one, at most "
               f"{kmax}; the oldest row's at most its step number)", int(frames["depth"][bad]))
    e = -1 - bad
    c.fail(f"state.frames.prev[{e}]", "the depth of the stream's newest row, or -1 when it ended "
           "an episode", int(frames["prev"][e]))
