"""Frame stacks in a shared-memory region (``SharedReplayBuffer(frame_stack=...)``): the
design of :mod:`tfdata.replay.frames` over shards, each shard one writer's stream (``num_envs =
1``, ``capacity = shard_capacity``); docs/design/frames.md, "Frame stacks over shards".

What the learner reads to rebuild a stack lives in the region, next to the rows:

``frames.depth`` uint8[slots], ``frames.final_idx`` int32[slots]
    Per slot, written with the row: steps since the episode's first row (at most ``K - 1``),
    and the row's entry in its shard's final table (-1: not an episode end).
``frames.hist.<field>`` (K - 1, shards, *frame)
    Per shard, the frames of the ``K - 1`` steps its ring overwrote last.
``frames.finals.<next>`` (shards, F, *frame), ``frames.final_rows`` int64[shards, F]
    Per shard, a ring of ``F`` (``final_frames``) final frames: the shard's ``j``-th episode
    end takes entry ``j % F``; ``final_rows`` says which row each entry belongs to (a write
    whose end would take an entry a held row still uses is refused).
``frames.pending.<next>`` (shards, *frame)
    The next frame of each shard's newest row.
``frames.words`` uint64[shards, 8], one cache line per shard, its writer's alone
    Word 0: episode ends stored; byte 8: whether the newest row's next frame is pending;
    bytes 16-17 (int16): ``prev``, the newest row's depth (-1 when the next row starts an
    episode).

A writer (:class:`ShardFrameWriter`) checks its write against its shard (nothing changes on
refusal) and updates these after its reserve and before it publishes its head, so the sequence
lock covers them; the learner's :class:`~tfdata.replay.frames.FrameStack` reads them through
:class:`ShardFrames`, and the buffer draws again a row whose stack read a slot in a write window
(kernel ``torn_stacks``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import SharedBufferError, SpecError
from ..spec import Spec
from ..storage import isolate_layout, restrict_layout, word_size
from ..replay.episodes import as_words, resolve_next_of, resolve_roles, stored_spec
from ..replay.frames import break_message, frame_spec, mode_of, padding_config, resolve_frames

#: bytes of a shard's writer words (one cache line)
_WORDS = 8
# positions in a shard's writer words: uint64 word, bool byte, int16 half-word
_ENDS, _HAS_PENDING_BYTE, _PREV_HALF = 0, 8, 8


def default_final_frames(cap: int) -> int:
    """Final-table entries per shard when ``final_frames`` is not given: episodes of 64 steps
    or more on average (over any ``cap`` rows) never fill it, as the single-process table's
    first size assumes."""
    return min(cap, cap // 64 + 2)


def elided(frames: dict) -> dict:
    """``{next field: stacked field}``: the next fields a frame region does not store."""
    return {nxt: name for name, nxt in frames["next"].items() if nxt is not None}


def stored(spec: Spec, frames: dict, layout) -> tuple:
    """``(stored spec, stored layout)``: each stacked field one frame wide and in a column of
    its own, its next field not stored (``layout`` resolved for ``spec``)."""
    st = stored_spec(frame_spec(spec, frames), elided(frames), True)
    return st, isolate_layout(restrict_layout(layout, st), st, list(frames["stacks"]))


def region_arrays(spec: Spec, frames: dict, shards: int, cap: int, final_frames: int) -> list:
    """``[(key, dtype, shape), ...]``: the frame arrays of a region (see the module docstring)."""
    slots = shards * cap
    out = [("frames.words", np.uint64, (shards, _WORDS)), ("frames.depth", np.uint8, (slots,)),
           ("frames.final_idx", np.int32, (slots,)),
           ("frames.final_rows", np.int64, (shards, final_frames))]
    for name, k in frames["stacks"].items():
        f = spec[name]
        out.append((f"frames.hist.{name}", f.dtype, (k - 1, shards) + f.shape[1:]))
        nxt = frames["next"][name]
        if nxt is not None:
            out.append((f"frames.finals.{nxt}", f.dtype, (shards, final_frames) + f.shape[1:]))
            out.append((f"frames.pending.{nxt}", f.dtype, (shards,) + f.shape[1:]))
    return out


def check_options(spec: Spec, frames: dict, cap: int, final_frames) -> int:
    """Refuse a shard too short for a stack, or a bad ``final_frames``; returns the entries."""
    kmax = max(frames["stacks"].values())
    if cap < kmax:
        raise ValueError(f"frame_stack: each writer's shard holds capacity / num_writers = {cap} "
                         f"rows, fewer than a stack of {kmax} frames; use a capacity of at least "
                         f"{kmax} per writer")
    if final_frames is None:
        return default_final_frames(cap)
    if (isinstance(final_frames, (bool, np.bool_)) or not isinstance(final_frames, (int, np.integer))
            or not 1 <= final_frames <= cap):
        raise ValueError(f"final_frames: expected an int in [1, {cap}] (final-frame entries per "
                         f"shard, at most the shard capacity), got {final_frames!r}")
    return int(final_frames)


def describe(frames: dict, final_frames: int, next_of: dict, roles: dict) -> dict:
    """What ``region.json`` says of the frames (JSON), for writers and :func:`from_doc`."""
    return {"stacks": dict(frames["stacks"]), "padding": padding_config(frames),
            "final_frames": int(final_frames), "next_of": dict(next_of), "roles": dict(roles)}


def from_doc(doc, spec: Spec, cap: int) -> tuple:
    """``(frames, final_frames, roles)`` from ``region.json``'s ``frames`` (untrusted): checked
    as the constructor checks its options. ValueError (SpecError, TypeError) naming the entry."""
    if not isinstance(doc, Mapping) or sorted(doc) != ["final_frames", "next_of", "padding", "roles", "stacks"]:
        raise ValueError(f"frames: expected an object with stacks, padding, final_frames, next_of, "
                         f"roles, got {str(doc)[:200]}")
    roles = resolve_roles(spec, doc["roles"])
    next_of = resolve_next_of(spec, doc["next_of"])
    if roles != doc["roles"] or next_of != doc["next_of"]:
        raise ValueError(f"frames.roles / next_of: not in resolved form ({str(doc['roles'])[:100]}, "
                         f"{str(doc['next_of'])[:100]})")
    stacks, padding = doc["stacks"], doc["padding"]
    if not isinstance(stacks, Mapping) or not isinstance(padding, Mapping) or set(padding) != set(stacks):
        raise ValueError("frames.stacks / padding: objects naming the same fields")
    frames = resolve_frames(spec, dict(stacks), dict(padding), next_of,
                            "terminated" in roles and "truncated" in roles)
    if frames is None:
        raise ValueError("frames.stacks: empty")
    final_frames = doc["final_frames"]
    if type(final_frames) is not int:
        raise ValueError(f"frames.final_frames: expected an int, got {str(final_frames)[:50]}")
    return frames, check_options(spec, frames, cap, final_frames), roles


class ShardFrames:
    """The frame arrays of a region, as the writers and the learner read them.

    Parameters
    ----------
    spec : Spec
        The rows as pushed (stacks whole).
    frames : dict
        From :func:`resolve_frames`.
    final_frames : int
    roles : dict
    arrays : dict of ndarray
        The region's arrays named by :func:`region_arrays`.
    storage
        The storage over the region's stored rows.
    shards, cap : int
    """

    def __init__(self, spec: Spec, frames: dict, final_frames: int, roles: dict, arrays: dict,
                 storage, shards: int, cap: int):
        self.spec, self.frames, self.final_frames, self.roles = spec, frames, final_frames, roles
        self.stacks, self.nexts, self.padding = frames["stacks"], frames["next"], frames["padding"]
        self.shards, self.cap = shards, cap
        self.kmax = max(self.stacks.values()) - 1
        self.words = arrays["frames.words"]
        self.depth = arrays["frames.depth"]
        self.final_idx = arrays["frames.final_idx"]
        self.final_rows = arrays["frames.final_rows"]
        self.hist, self.finals, self.pending, self.src, self.pads = {}, {}, {}, {}, {}
        self.final_table = {}  # the finals of the shards one after the other: (shards * F, width)
        # the arrays by field, at the fields' dtypes and shapes (checkpoints)
        self.hist_arrays = {n: arrays[f"frames.hist.{n}"] for n in self.stacks}
        self.finals_arrays = {nx: arrays[f"frames.finals.{nx}"] for nx in self.nexts.values() if nx is not None}
        self.pending_arrays = {nx: arrays[f"frames.pending.{nx}"] for nx in self.nexts.values() if nx is not None}
        for name, k in self.stacks.items():
            f = spec[name]
            fb = f.nbytes // k
            word = word_size(storage.field_offset(name), fb)
            src, off, width = storage.field_words(name, word)
            self.src[name] = (word, src, off, width)
            self.hist[name] = as_words(self.hist_arrays[name], word, 2)
            nxt = self.nexts[name]
            if nxt is not None:
                self.finals[nxt] = as_words(self.finals_arrays[nxt], word, 2)
                self.final_table[nxt] = self.finals[nxt].reshape(shards * final_frames, -1)
                self.pending[nxt] = as_words(self.pending_arrays[nxt], word)
            p = self.padding[name]
            pad = np.zeros(f.shape[1:], f.dtype) if isinstance(p, str) else np.asarray(p, f.dtype)
            self.pads[name] = as_words(np.ascontiguousarray(pad).reshape(1, -1), word)[0]

    # the tables as FrameStack reads them from FrameStacks and Episodes (a shard's head its steps)
    steps = 0

    def source(self, name: str):
        return self.src[name]

    def pad_words(self, name: str, word: int) -> np.ndarray:
        return self.pads[name]

    def hist_words(self, name: str, word: int) -> np.ndarray:
        return self.hist[name]

    def final_words(self, name: str, word: int) -> np.ndarray:
        return self.final_table[name]

    def pending_words(self, name: str, word: int) -> np.ndarray:
        return self.pending[name]

    def start(self) -> None:
        """A new region: every shard's next row starts an episode (the owner, before writers)."""
        for s in range(self.shards):
            self.prev(s)[0] = -1

    def prev(self, s: int) -> np.ndarray:
        """int16[1] view: shard ``s``'s newest depth (-1: its next row starts an episode)."""
        return self.words[s].view(np.int16)[_PREV_HALF:_PREV_HALF + 1]

    def has_pending(self, s: int) -> np.ndarray:
        """bool[1] view: whether shard ``s``'s newest row's next frame is pending."""
        return self.words[s].view(np.bool_)[_HAS_PENDING_BYTE:_HAS_PENDING_BYTE + 1]

    def ends(self, s: int) -> int:
        return int(self.words[s, _ENDS])


class ShardFrameWriter:
    """One writer's side: :meth:`check` a write against its shard (nothing changes), then
    :meth:`write` its frames' bookkeeping (after the reserve, before the rows are stored)."""

    def __init__(self, sf: ShardFrames, shard: int):
        from .. import kernels

        self.k, self.sf, self.shard = kernels, sf, shard
        spec, cap = sf.spec, sf.cap
        self.cap = cap
        base = shard * cap
        self.term_i = spec.names.index(sf.roles["terminated"])
        self.trunc_i = spec.names.index(sf.roles["truncated"])
        self.index = {n: spec.names.index(n) for n in spec.names}
        skipped = set(elided(sf.frames))
        self.stored_pos = [i for i, n in enumerate(spec.names) if n not in skipped]
        self.prev = sf.prev(shard)
        self.has_pending = sf.has_pending(shard)
        self.cur = np.zeros(1, np.int16)
        self.depth = sf.depth[base:base + cap]
        self.final_idx = sf.final_idx[base:base + cap]
        self.final_rows = sf.final_rows[shard]
        self.fields = []  # (name, K, word, src, off, hist, pad, mode, nxt, finals, pending), largest K last
        for name in sorted(sf.stacks, key=lambda n: sf.stacks[n]):
            word, src, off, width = sf.src[name]
            nxt = sf.nexts[name]
            self.fields.append((name, sf.stacks[name], word, src[base:base + cap], off,
                                sf.hist[name][:, shard:shard + 1], sf.pads[name],
                                mode_of(sf.padding[name]), nxt,
                                None if nxt is None else sf.finals[nxt][shard],
                                None if nxt is None else sf.pending[nxt][shard]))
        self._pending = None

    def check(self, values: list, n: int, head: int) -> list:
        """Refuse a write of ``n`` rows (values in the spec's order, stacks whole) that the
        shard's frames would not rebuild (SpecError), or whose episode ends would take a
        final-table entry a held row still uses (SharedBufferError); nothing changes. Returns
        the stored values (each stacked field's newest frame, its next field left out)."""
        k, cap = self.k, self.cap
        term, trunc = values[self.term_i], values[self.trunc_i]
        out = list(values)
        kept = []
        for name, kk, word, src, off, hist, pad, mode, nxt, finals, pending in self.fields:
            i = self.index[name]
            obs = as_words(np.ascontiguousarray(values[i]), word)
            nx = obs[:0] if nxt is None else as_words(np.ascontiguousarray(values[self.index[nxt]]), word)
            r = k.frame_breaks(obs, nx, term, trunc, 1, head % cap, cap, src, off, self.prev, mode,
                               pad, self.cur)
            if r >= 0:
                raise SpecError(break_message(name, kk, self.sf.padding[name], nxt, 1, r // 4, r % 4,
                                              f"shard {self.shard}, row {r // 4} of the write"))
            if nxt is not None:
                width = pad.shape[0]
                top = (kk - 1) * width
                # the newest frame continues the stream: the previous row's next frame (elision)
                # (compared as words: the kernel takes any integer dtype)
                r = k.first_discontinuity(np.ascontiguousarray(obs[:, top:]),
                                          np.ascontiguousarray(nx[:, top:]), term, trunc,
                                          pending.reshape(1, -1), self.has_pending)
                if r >= 0:
                    raise SpecError(
                        f"shard {self.shard}, row {r} of the write: the newest frame of {name!r} "
                        f"differs from the newest frame of {nxt!r} pushed with the stream's "
                        f"previous row, which did not end an episode: with frame_stack the next "
                        f"frame is read from the next row, so the stream must be continuous "
                        f"(mark the previous row terminated or truncated)")
            out[i] = values[i][:, -1]
            kept.append((obs, nx))
        skip = max(0, n - cap)
        if self.sf.finals:
            r = k.final_ring_room(term, trunc, skip, head, cap, self.sf.ends(self.shard), self.final_rows)
            if r >= 0:
                f = self.sf.final_frames
                raise SharedBufferError(
                    f"shard {self.shard}, row {r} of the write: it ends an episode, and the "
                    f"shard's table of final frames (final_frames={f} entries) is full of rows "
                    f"still held: more than {f} episodes end within {cap} rows of the shard "
                    f"(nothing was written). Build the buffer with a larger final_frames "
                    f"(at most the shard capacity {cap}), e.g. {min(cap, 2 * f)}")
        self._pending = (kept, term, trunc, n, head)
        return [out[i] for i in self.stored_pos]

    def write(self) -> None:
        """Keep the frames of the rows the checked write overwrites, stamp depths, keep its
        final and pending frames (after the reserve, before the rows are stored)."""
        kept, term, trunc, n, head = self._pending
        self._pending = None
        k, cap = self.k, self.cap
        size = min(head, cap)
        skip = max(0, n - cap)
        ends = self.sf.ends(self.shard)
        prev = self.prev
        last = len(self.fields) - 1
        for i, ((name, kk, word, src, off, hist, pad, mode, nxt, finals, pending), (obs, nx)) in \
                enumerate(zip(self.fields, kept)):
            # every field moves prev on the same way; the largest K (last) keeps it
            k.frames_write(obs, term, trunc, 1, head % cap, cap, size, head, src, off, hist,
                           prev if i == last else prev.copy(), self.depth)
            if nxt is not None:
                k.final_ring_write(nx, term, trunc, skip, ends, finals, pending)
        self.sf.words[self.shard, _ENDS] = k.final_ring_index(term, trunc, skip, head, ends,
                                                                self.final_idx, self.final_rows)
        self.has_pending[0] = not (term[n - 1] or trunc[n - 1])


# -- checkpoints: besides the rows and the depths, what the kept rows' stacks read that is not a
# kept row: the final frames of the kept episode ends (``final_slots``, ``finals``), each shard's
# pending frame, and the frames of the K - 1 rows before each shard's oldest kept row (``back``,
# oldest first). The writer words are derived from the rows on load.

def copies(sf: ShardFrames) -> dict:
    """Copies of the frame arrays (writers may be writing: see :func:`checkpoint_state`)."""
    return {"depth": sf.depth.copy(), "final_idx": sf.final_idx.copy(),
            "finals": {n: a.copy() for n, a in sf.finals_arrays.items()},
            "pending": {n: a.copy() for n, a in sf.pending_arrays.items()},
            "hist": {n: a.copy() for n, a in sf.hist_arrays.items()}}


def checkpoint_state(sf: ShardFrames, storage, reserved: np.ndarray, heads: list, copied: dict,
                     kernels) -> tuple:
    """The frame part of a checkpoint whose rows were copied after ``copied`` (taken just after
    the heads were read), and the rows it keeps: ``(heads, dropped, state)``. Which rows a shard
    keeps: docs/design/frames.md, "Checkpoints"; frames read from the region after the copy are
    checked against the writer's reserve, and read again if it moved over them.
    """
    shards, cap, kmax = sf.shards, sf.cap, sf.kmax
    scratch = np.zeros(7 * shards + 2 * (kmax + 1), np.int64)
    scratch[shards:2 * shards] = heads  # the windows of torn_after_copy are judged from these
    for s in range(shards):
        scratch[2 * shards + s] = heads[s] % cap
    # an acquire fence: the reserves read below are read after the copies they judge
    kernels.torn_after_copy(reserved, cap, scratch, np.zeros(0, np.int64), np.zeros(0, np.int64))
    out_heads, out_dropped = [], []
    back = {n: np.zeros((shards, k - 1) + sf.spec[n].shape[1:], sf.spec[n].dtype)
            for n, k in sf.stacks.items()}
    pending = {n: np.zeros((shards,) + sf.spec[n].shape[1:], sf.spec[n].dtype) for n in sf.pending_arrays}
    fidx = copied["final_idx"]
    final_slots = []
    for s in range(shards):
        h = heads[s]
        held = min(h, cap)
        oldest = h - held
        base = s * cap
        res = int(reserved[s])
        for _ in range(1000):
            t = min(held, max(0, res - cap - oldest))
            lo, hi = oldest + t, h
            ended = held > 0 and fidx[base + (h - 1) % cap] >= 0
            if lo < hi and res > h and not ended:
                hi = h - 1
            if lo > oldest:
                lo = min(hi, lo + kmax)
            lo = min(lo, hi)
            if lo == hi:  # nothing kept: no frame to read
                break
            live = []  # rows whose frames are read from the ring now
            for name, k in sf.stacks.items():
                col = storage.field(name)
                for i in range(k - 1):
                    q = lo - (k - 1) + i
                    if q < 0:
                        continue
                    if q >= oldest:
                        back[name][s, i] = col[base + q % cap]
                        live.append(q)
                    else:  # overwritten before the heads: the hist (unchanged: no eviction began)
                        back[name][s, i] = copied["hist"][name][q % (k - 1), s]
            for name, nxt in sf.nexts.items():
                if nxt is None:
                    continue
                if hi < h and hi > lo:  # the newest kept row's next frame is the dropped row's frame
                    pending[nxt][s] = storage.field(name)[base + (h - 1) % cap]
                    live.append(h - 1)
                else:
                    pending[nxt][s] = copied["pending"][nxt][s]
            rows = np.array(sorted(set(live)), np.int64) % cap + base
            mark = np.zeros(rows.shape[0], np.int64)
            if not rows.shape[0] or not kernels.torn_after_copy(reserved, cap, scratch, rows, mark):
                break
            res = int(reserved[s])  # the writer moved over frames read: again, further on
        else:  # pragma: no cover - a writer lapping its shard 1000 times during a few reads
            raise SharedBufferError(f"checkpoint: the writer of shard {s} kept overwriting the "
                                    f"rows being saved")
        # restore keeps rows [hi - min(hi, cap) + dropped, hi)
        out_heads.append(hi)
        out_dropped.append(lo - (hi - min(hi, cap)))
        for q in range(lo, hi):
            if fidx[base + q % cap] >= 0:
                final_slots.append(base + q % cap)
    final_slots = np.array(sorted(final_slots), np.int64)
    finals = {}
    for nxt, table in copied["finals"].items():
        f = table.shape[1]
        entries = np.clip(fidx[final_slots], 0, f - 1)
        finals[nxt] = table[final_slots // cap, entries]
    state = {"stacks": dict(sf.stacks), "depth": copied["depth"], "final_slots": final_slots,
             "finals": finals, "pending": pending, "back": back}
    return out_heads, out_dropped, state


def restore(sf: ShardFrames, storage, state: dict, heads: list, dropped: list) -> None:
    """Fill a new region's frame arrays from a checked checkpoint (:func:`checkpoint_state`),
    its rows already in place (a shard that lost none of its oldest rows keeps its slots and
    row numbers, another holds its rows from its first slot on, numbered from 0). The final
    entries are given again in row order; the ``back`` frames go to the hist and, for a shard
    moved to its first slots, also to the free slots those rows would occupy (row ``-j`` in
    slot ``cap - j``): the stack kernels read the ring while no newer row took a slot, and the
    writer's checks read the ring only."""
    cap, kmax = sf.cap, sf.kmax
    saved_depth, final_slots = state["depth"], state["final_slots"]
    index = {int(x): i for i, x in enumerate(final_slots.tolist())}
    sf.final_idx[:] = -1
    for s in range(sf.shards):
        h, t = heads[s], dropped[s]
        held = min(h, cap)
        lo = h - held + t
        base = s * cap
        shift = 0 if t == 0 else lo  # new row number = old - shift
        e = 0
        for q in range(lo, h):
            old, new = base + q % cap, base + (q - shift) % cap
            sf.depth[new] = saved_depth[old]
            i = index.get(old)
            if i is not None:
                sf.final_idx[new] = e
                sf.final_rows[s, e] = q - shift
                for nxt, table in sf.finals_arrays.items():
                    table[s, e] = state["finals"][nxt][i]
                e += 1
            else:
                sf.final_idx[new] = -1
        sf.words[s, _ENDS] = e
        new_head = h - shift
        for name, k in sf.stacks.items():
            col = storage.field(name)
            for i in range(k - 1):
                q = lo - shift - (k - 1) + i
                sf.hist_arrays[name][q % (k - 1), s] = state["back"][name][s, i]
                if shift and q >= new_head - cap:  # a free slot: no kept row is there
                    col[base + q % cap] = state["back"][name][s, i]
        for nxt, p in sf.pending_arrays.items():
            p[s] = state["pending"][nxt][s]
        newest = base + (h - 1) % cap
        ended = h > lo and newest in index
        sf.has_pending(s)[0] = h > lo and not ended
        sf.prev(s)[0] = -1 if h == lo or ended else min(int(saved_depth[newest]), kmax)


def check_checkpoint(state: dict, heads: list, dropped: list, cap: int, kmax: int,
                     final_frames: int, term: np.ndarray, trunc: np.ndarray):
    """The row-level consistency of a checkpoint's frame part with its rows (read ``term`` and
    ``trunc`` of every slot): ``final_slots`` are exactly the kept rows that end an episode
    (at most ``final_frames`` per shard), and the kept rows' depths are what inserting them
    gave. Returns None, or ``(field, expected, got)`` of the first problem."""
    ends = np.asarray(term, bool) | np.asarray(trunc, bool)
    depth = state["depth"]
    want = []
    for s, (h, t) in enumerate(zip(heads, dropped)):
        held = min(h, cap)
        lo = h - held + t
        base = s * cap
        kept = [base + q % cap for q in range(lo, h)]
        mine = [x for x in kept if ends[x]]
        if len(mine) > final_frames:
            return ("frames.final_slots", f"at most final_frames={final_frames} episode ends in "
                    f"shard {s}", f"{len(mine)}")
        want += mine
        if kept and int(depth[kept[0]]) > min(kmax, lo):
            return (f"frames.depth[{kept[0]}]", f"at most {min(kmax, lo)} (the rows before it)",
                    int(depth[kept[0]]))
        for a, b in zip(kept, kept[1:]):
            d = 0 if ends[a] else min(int(depth[a]) + 1, kmax)
            if int(depth[b]) != d:
                return (f"frames.depth[{b}]", f"{d} (the depth of the row before it, and its "
                        f"episode end)", int(depth[b]))
    got = state["final_slots"]
    if sorted(want) != got.tolist():
        return ("frames.final_slots", "the slots of the kept rows that end an episode, ascending",
                f"{got.tolist()[:10]}")
    return None
