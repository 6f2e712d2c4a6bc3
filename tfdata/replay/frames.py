"""Frame stacks stored one frame per row (``frame_stack=``).

An image observation stacked over the last ``K`` steps (gymnasium's ``FrameStackObservation``:
``obs`` of shape ``(K, *frame)``, oldest frame first) repeats each frame ``K`` times across rows,
and ``K`` more times in ``next_obs``. A buffer built with ``frame_stack={"obs": K}`` stores only
the newest frame of each row's ``obs``; the ``next_obs`` field (the next of ``obs``) is not stored
at all: its newest frame is elided as ``elide_next`` elides a next field (read from the stream's
next row, the final table at an episode's end, ``pending`` for the newest step), the rest is the
row's own stack shifted by one. The stacks are rebuilt at sample time by
:func:`tfdata.kernels._frames.frame_stacks`, straight into the output ring.

Two pieces of bookkeeping make the rebuilt stacks exact:

* ``depth[slot]`` (uint8): steps since the episode's first row, at most ``K - 1``. Positions
  before the episode's first row are padded as ``FrameStackObservation`` pads them
  (``frame_padding="reset"``, its default: the first frame repeated; ``"zero"``; or a frame);
  so a stack never takes a frame of another episode, another environment or an overwritten row.
* ``hist``: the frames of the ``K - 1`` steps per stream most recently overwritten by the ring,
  which the oldest held rows' stacks still reach.

Writes are checked before anything changes: an episode's first row must carry the padding, any
other row the frames its stream's previous rows stored, and a ``next_obs`` stack the ``obs``
stack shifted by one frame (its newest frame is then checked against the next row, as
elision does). A stream that breaks any of these is refused with a SpecError naming the row,
the field and the position.

The layout applies to the other fields: a stacked field is stored as a column of its own in
every layout (its frames are read by the stack kernels, never gathered with the row).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np

from ..errors import SpecError
from ..spec import Field, Spec
from ..storage import WORD_TYPES, word_size

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
    try:
        arr = np.array(frame.coerce(p), dtype=field.dtype)
    except SpecError as exc:
        raise SpecError(f"frame_padding for {field.name!r}: {exc}") from None
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


def _words(arr: np.ndarray, word: int) -> np.ndarray:
    return arr.reshape(arr.shape[0], -1).view(np.uint8).view(WORD_TYPES[word])


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
        return self._pads[name].reshape(1, -1).view(np.uint8).view(WORD_TYPES[word])[0]

    def hist_words(self, name: str, word: int) -> np.ndarray:
        h = self.hist[name]
        return h.reshape(h.shape[0], h.shape[1], -1).view(np.uint8).view(WORD_TYPES[word])

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
            obs = _words(np.ascontiguousarray(values[i]), word)
            nxt_name = self.nexts[name]
            if nxt_name is not None:
                j = self._index[nxt_name]
                nxt = _words(np.ascontiguousarray(values[j]), word)
            else:
                nxt = obs[:0]
            pad = self.pad_words(name, word)
            r = k.frame_breaks(obs, nxt, term, trunc, e, cursor, self.capacity, src, off,
                               self.prev, mode_of(self.padding[name]), pad, self._cur)
            if r >= 0:
                raise SpecError(self._message(name, kk, r // 4, r % 4))
            out[i] = values[i][:, -1]
            if nxt_name is not None:
                out[j] = values[j][:, -1]
            pending.append((name, obs))
        self._pending = (pending, term, trunc)
        return out

    def _message(self, name: str, kk: int, row: int, reason: int) -> str:
        return break_message(name, kk, self.padding[name], self.nexts[name], self.num_envs, row, reason)

    def write(self, n: int, cursor: int, size: int) -> None:
        """After :meth:`check` accepted the write and before the rows are stored: keep the
        frames the write overwrites that held stacks still reach, stamp depths. Lock held."""
        pending, term, trunc = self._pending
        self._pending = None
        k = self._k
        prev = self.prev
        # depth and prev are capped at the field's K - 1 by frames_write: the field with the
        # largest K writes them last (a smaller cap would pad the larger stacks too early)
        pending = sorted(pending, key=lambda p: self.stacks[p[0]])
        for i, (name, obs) in enumerate(pending):
            word, src, off, width = self._src[name]
            # every field moves prev on the same way: keep it for the last one
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

    def check_state(self, state, size: int) -> dict:
        """Validate a :meth:`state_dict` (untrusted); ValueError naming the entry."""
        if not isinstance(state, Mapping):
            raise ValueError("state has no frame-stack bookkeeping ('frames' entry)")
        if state.get("stacks") != self.stacks:
            raise ValueError(f"state frames.stacks {str(state.get('stacks'))[:100]} differs from this "
                             f"buffer's frame_stack {self.stacks}")
        steps = state.get("steps")
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 0 <= steps < 2**62:
            raise ValueError(f"state frames.steps: expected an int in [0, 2**62), got {str(steps)[:50]}")
        if steps * self.num_envs < size:
            raise ValueError(f"state frames.steps {steps}: fewer steps than the {size} rows held")
        kmax = max(self.stacks.values()) - 1
        depth = state.get("depth")
        _expect(depth, np.uint8, (size,), "frames.depth")
        if size and int(depth.max()) > kmax:
            raise ValueError(f"state frames.depth: values must be in [0, {kmax}], got {int(depth.max())}")
        prev = state.get("prev")
        _expect(prev, np.int16, (self.num_envs,), "frames.prev")
        if prev.size and (int(prev.min()) < -1 or int(prev.max()) > kmax):
            raise ValueError(f"state frames.prev: values must be in [-1, {kmax}]")
        hist = state.get("hist")
        if not isinstance(hist, Mapping) or set(hist) != set(self.hist):
            raise ValueError(f"state frames.hist: expected an entry per stacked field {sorted(self.hist)}")
        for n, h in self.hist.items():
            _expect(hist[n], h.dtype, h.shape, f"frames.hist[{n!r}]")
        return state

    def load_state(self, state, size: int) -> None:
        self.clear()
        self.depth[:size] = state["depth"]
        self.prev[...] = state["prev"]
        self.steps = int(state["steps"])
        for n, h in self.hist.items():
            h[...] = state["hist"][n]


def _expect(arr, dtype, shape, what: str) -> None:
    if not isinstance(arr, np.ndarray) or arr.dtype != dtype or arr.shape != shape:
        got = f"{arr.dtype}{arr.shape}" if isinstance(arr, np.ndarray) else type(arr).__name__
        raise ValueError(f"state {what}: expected {np.dtype(dtype)}{shape}, got {got}")


class FrameStack:
    """The transform that fills the stacked fields (and their next fields) of a batch from the
    stored frames (see :mod:`tfdata.replay.transforms` for the contract)."""

    on_slices = True

    def __init__(self, spec: Spec, frames: FrameStacks, episodes, flags, num_envs: int,
                 capacity: int, allocator, writer):
        from .. import kernels

        self.k, self.spec, self.frames, self.episodes = kernels, spec, frames, episodes
        self.flags, self.num_envs, self.capacity, self.allocator = flags, num_envs, capacity, allocator
        self.writer = writer
        self.names = list(frames.stacks)
        self.wanted = None  # every field; a projection sets the names it fills

    @staticmethod
    def plan_ring(spec: Spec, frames: dict, rows: int, fields=None) -> int:
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
        arrays = {}
        for name in self.names:
            for field in (name, self.frames.nexts[name]):
                if self._wants(field):
                    f = self.spec[field]
                    arrays[field] = self.allocator.zeros((rows,) + f.shape, f.dtype)
        return arrays

    def batch_view(self, arrays: dict, fields: dict, attrs: dict) -> None:
        for name, arr in arrays.items():
            fields[name] = arr

    def apply(self, out, arrays: dict, rows: np.ndarray, cursor: int) -> np.ndarray:
        fr, k, ep = self.frames, self.k, self.episodes
        e, cap, steps = self.num_envs, self.capacity, fr.steps
        for name in self.names:
            word, src, off, width = fr.source(name)
            pad = fr.pad_words(name, word)
            mode = mode_of(fr.padding[name])
            hist = fr.hist_words(name, word)
            if self._wants(name):
                k.frame_stacks(out.indices, cursor, steps, e, cap, fr.depth, src, off, hist, pad, mode,
                               _words(arrays[name], word))
            nxt = fr.nexts[name]
            if self._wants(nxt):
                k.next_frame_stacks(rows, cursor, steps, e, cap, fr.depth, src, off, hist, pad, mode,
                                    self.flags[0], self.flags[1], ep.final_idx,
                                    ep.final_words(nxt, word), ep.pending_words(nxt, word),
                                    _words(arrays[nxt], word))
        return rows
