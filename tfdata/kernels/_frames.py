"""Frame-stack kernels: a stacked observation stored one frame per row, rebuilt at sample time.

A field declared as a stack of ``K`` frames (``obs: u1[4, 84, 84]`` with ``frame_stack=4``) is
stored as its newest frame only (``u1[84, 84]``, one per row, in the interleaved ring of
:mod:`tfdata.kernels._episodes`). The stack of row ``x`` is the frames of the rows ``x - j*E``
(``j = K-1 .. 0``, oldest first) of the same stream and episode; ``depth[x]`` (steps since the
episode's first row, at most ``K - 1``) says how many of them belong to the episode, and the
positions before the episode's first row are *padded* as gymnasium's ``FrameStackObservation``
pads them:

* ``PAD_RESET`` (its default ``padding_type="reset"``): the episode's first frame, repeated;
* ``PAD_ZERO``: zeros;
* ``PAD_VALUE``: a given frame (``pad``).

A row the ring has overwritten keeps its frame in ``hist`` (``K - 1`` frames per stream, the
steps evicted most recently: step ``s`` at ``hist[s % (K - 1), e]``) for as long as a held row's
stack reaches it, so every held row can be sampled, exactly as a buffer that stores whole stacks.

The stacks are written once for both kinds of streams of :mod:`tfdata.kernels._streams` (a ring
of interleaved streams, the shards of a shared region): templates whose geometry functions
(where a slot's stream is, its age, its final-table row) :func:`specialize` binds per kind, as
the n-step windows and slices are (:data:`RING_STACKS`, :data:`SHARD_STACKS`). The per-slot
tables are the same arrays on both sides: ``depth`` and ``final_idx`` per slot, ``hist`` and
``pending`` per stream.

Frames are copied as words (``uintX``: uint64 when 8 divides the frame's bytes and offset, else
uint8, :func:`tfdata.storage.word_size`; two word types, two compiles per kernel); the storage
is read through ``(words, offset, width)`` views, so nothing here knows the layout.
Nothing allocates; slots, depths and table entries are bounded before use.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .._config import INLINE_OPTIONS, NJIT_OPTIONS
from ._shared import in_windows, windows
from ._streams import SHARD_HEADER, bind
from ._sync import fence_acquire

PAD_RESET = 0
PAD_ZERO = 1
PAD_VALUE = 2

# insert checks: what a refused row got wrong (``frame_breaks`` returns ``row * 4 + reason``)
BREAK_PADDING = 0  # an episode's first row whose earlier frames are not the padding
BREAK_CONTINUITY = 1  # earlier frames that are not the stream's previous frames
BREAK_NEXT = 2  # a next stack that is not the stack shifted by one frame


@intrinsic
def copy_words(typingctx, dst, at, src, start, n):
    """``dst.flat[at:at + n] = src.flat[start:start + n]`` by ``memcpy``: ``dst`` and ``src``
    C-contiguous arrays (any number of dimensions) of one dtype, ``at`` and ``start`` element
    offsets. A frame copied this way costs the same in bytes or in 64-bit words (a loop over
    bytes is about three times slower than over words), so the word type is a matter of the
    compares only. No bounds: the caller checked."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.layout == "C"
            and src.layout == "C" and dst.dtype == src.dtype
            and all(isinstance(t, types.Integer) for t in (at, start, n))):
        return None

    def codegen(context, builder, sig, args):
        d = context.make_array(sig.args[0])(context, builder, args[0])
        s = context.make_array(sig.args[2])(context, builder, args[2])
        a, b, m = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (1, 3, 4))
        size = context.get_constant(types.intp, context.get_abi_sizeof(
            context.get_data_type(sig.args[0].dtype)))
        dptr = builder.gep(builder.bitcast(d.data, cgutils.voidptr_t), [builder.mul(a, size)])
        sptr = builder.gep(builder.bitcast(s.data, cgutils.voidptr_t), [builder.mul(b, size)])
        cgutils.raw_memcpy(builder, dptr, sptr, builder.mul(m, size), 1)
        return context.get_dummy_value()

    return types.none(dst, at, src, start, n), codegen


# -- where a stack's frames are: one set of functions per kind of streams ---------------------
# (the kinds of :mod:`._streams`: a ring of ``E`` interleaved streams, or one stream per shard).
# Both see a stream as slots ``base + (local + j * step) % span``: the ring, ``base = 0``,
# ``step = E``, ``span = C``; a shard, ``base = s * cap``, ``step = 1``, ``span = cap``. Every
# function takes the geometry words ``geo`` and ``g``, what ``prepare`` made of them once per
# call (integers only, as in :mod:`._streams`), ``g[0]`` the step and ``g[1]`` the span.
@njit(**INLINE_OPTIONS)
def _age_depth(x, newest, num_envs, capacity, depth, kmax):
    d = newest - (x - x % num_envs)
    if d < 0:
        d += capacity
    dep = depth[x]
    if dep > kmax:  # a bound, whatever the array holds
        dep = kmax
    return d // num_envs, dep


age_depth = _age_depth  # the cold tier's kernels (kernels._cold) inline it too


@njit(**INLINE_OPTIONS)
def ring_prepare(geo, steps):
    """``(E, C, newest step's first slot, steps per stream)`` from ``[cursor, E, C]``."""
    num_envs, capacity = geo[1], geo[2]
    newest = geo[0] - num_envs
    if newest < 0:
        newest += capacity
    return num_envs, capacity, newest, steps


@njit(**INLINE_OPTIONS)
def ring_locate(geo, g, x, depth, kmax):
    """``(base, local, stream, age, depth, rows its stream wrote)`` of held slot ``x`` (the
    age: rows newer in its stream; the depth at most ``kmax``)."""
    a, d = _age_depth(x, g[2], g[0], g[1], depth, kmax)
    return 0, x, x % g[0], a, d, g[3]


@njit(**INLINE_OPTIONS)
def ring_final_row(g, e, f, n):
    """The row of entry ``f`` of stream ``e`` in a table of ``n`` rows (one for every stream),
    or -1."""
    return f if 0 <= f < n else -1


@njit(**INLINE_OPTIONS)
def shard_prepare(geo, steps):
    """``(1, cap, S, 0)`` from ``[S, cap, snapshot...]`` (a shard's head is its steps)."""
    return 1, geo[1], geo[0], 0


@njit(**INLINE_OPTIONS)
def shard_locate(geo, g, x, depth, kmax):
    """:func:`ring_locate` of region slot ``x`` as of the heads in ``geo``; each bounded."""
    cap, shards = g[1], g[2]
    s = x // cap
    if s < 0:
        s = 0
    elif s >= shards:
        s = shards - 1
    base = s * cap
    local = x - base
    if local < 0 or local >= cap:
        local = 0
    at = SHARD_HEADER + shards + s
    h = geo[at] if at < geo.shape[0] else 0
    if h < 0:
        h = 0
    newest = h % cap - 1
    if newest < 0:
        newest += cap
    a = newest - local
    if a < 0:
        a += cap
    d = depth[base + local]
    if d > kmax:  # a bound, whatever the array holds
        d = kmax
    return base, local, s, a, d, h


@njit(**INLINE_OPTIONS)
def shard_final_row(g, e, f, n):
    """The row of entry ``f`` of shard ``e``'s table (``S`` tables of ``n // S`` rows), or -1."""
    per = n // g[2]
    return e * per + f if 0 <= f < per else -1


@njit(**INLINE_OPTIONS)
def _put_frame(dst, i, o, base, x, a, j, e, t, step, span, src, src_off, hist, width):
    """Frame ``j`` steps back from slot ``base + x`` (age ``a``, stream ``e`` of ``t`` rows)
    into ``dst[i, o:o+width]``: from its slot while the stream holds it, else from ``hist``."""
    if a + j < span // step:
        s = x - j * step
        if s < 0:
            s += span
        s += base
        copy_words(dst, i * dst.shape[1] + o, src, s * src.shape[1] + src_off, width)
    else:
        h = (t - 1 - a - j) % hist.shape[0]
        copy_words(dst, i * dst.shape[1] + o, hist, (h * hist.shape[1] + e) * hist.shape[2], width)


@njit(**INLINE_OPTIONS)
def _put_back(dst, i, count, base, x, a, d, e, t, step, span, src, src_off, hist, pad, mode, width):
    """Positions ``0 .. count-1`` of the stack of slot ``base + x``: the frame ``count - 1 - p``
    steps back, or padding beyond the episode's first row (``d`` steps back)."""
    for p in range(count):
        j = count - 1 - p
        o = p * width
        if j <= d:
            _put_frame(dst, i, o, base, x, a, j, e, t, step, span, src, src_off, hist, width)
        elif mode == PAD_RESET:
            _put_frame(dst, i, o, base, x, a, d, e, t, step, span, src, src_off, hist, width)
        elif mode == PAD_ZERO:
            for w in range(width):
                dst[i, o + w] = 0
        else:
            copy_words(dst, i * dst.shape[1] + o, pad, 0, width)


# -- the templates ----------------------------------------------------------------------------
#: bound by :func:`specialize` to one kind's functions above (``ring_*`` or ``shard_*``)
prepare = locate = final_row = None


def _put_next(g, dst, i, o, base, x, a, e, src, src_off, term, trunc, final_idx, finals, pending,
              width):
    """Slot ``base + x``'s next frame into ``dst[i, o:o+width]``: its final frame at an
    episode's end (when its table entry exists), the pending frame of its stream's newest row
    (age ``a == 0``: the next row is not written yet), else the stream's next row's frame."""
    y = base + x
    f = final_row(g, e, final_idx[y] if term[y] or trunc[y] else -1, finals.shape[0])
    if f >= 0:
        copy_words(dst, i * dst.shape[1] + o, finals, f * finals.shape[1], width)
    elif a == 0:
        copy_words(dst, i * dst.shape[1] + o, pending, e * pending.shape[1], width)
    else:
        s = x + g[0]
        if s >= g[1]:
            s -= g[1]
        s += base
        copy_words(dst, i * dst.shape[1] + o, src, s * src.shape[1] + src_off, width)


def stacks(geo, steps, rows, depth, src, src_off, hist, pad, mode, dst):
    """The stacks of ``rows`` (their observation), rebuilt from one stored frame per row.

    Parameters
    ----------
    geo : ndarray of int64
        The streams' geometry (:mod:`tfdata.kernels._streams`): the ring's ``[cursor, E, C]``,
        or the shards' ``[S, cap, heads snapshot...]``.
    steps : int
        Ring: the steps each stream wrote since the buffer was cleared (shards: unused, a
        shard's head says it).
    rows : ndarray of int64, shape (B,)
        Held slots.
    depth : ndarray of uint8, shape (slots,)
        Steps since the episode's first row, at most ``K - 1``.
    src : ndarray of uintX, shape (slots, row_words)
        Storage words; the frame is at word ``src_off``, ``width = dst.shape[1] // K`` words.
    hist : ndarray of uintX, shape (K - 1, streams, width)
        Frames of overwritten rows (step ``t`` of stream ``e`` at ``hist[t % (K - 1), e]``).
    pad : ndarray of uintX, shape (width,)
        The padding frame (``mode == PAD_VALUE``).
    mode : int
        ``PAD_RESET``, ``PAD_ZERO`` or ``PAD_VALUE``.
    dst : ndarray of uintX, shape (B, K * width)
        The stacks, oldest frame first.
    """
    width = pad.shape[0]
    k = hist.shape[0] + 1
    g = prepare(geo, steps)
    for i in range(rows.shape[0]):
        base, x, e, a, d, t = locate(geo, g, rows[i], depth, k - 1)
        _put_back(dst, i, k, base, x, a, d, e, t, g[0], g[1], src, src_off, hist, pad, mode, width)


def next_stacks(geo, steps, rows, depth, src, src_off, hist, pad, mode, term, trunc, final_idx,
                finals, pending, dst):
    """The next stacks of ``rows``: each row's stack shifted by one frame, then its next frame
    (the stream's next row, the final table at an episode's end, ``pending`` for its stream's
    newest row).

    Parameters are those of :func:`stacks`, and (as ``copy_next_elided``):

    term, trunc : ndarray of bool, shape (slots,), any stride
    final_idx : ndarray of int32, shape (slots,)
        Final-table entry of episode-ending rows, else -1 (a shard's: an entry of its table).
    finals : ndarray of uintX, shape (F, width)
        Final frames of episode-ending rows: one table (ring), or each shard's ``F / S``
        entries, shard by shard.
    pending : ndarray of uintX, shape (streams, width)
        Next frame of each stream's newest row.
    """
    width = pad.shape[0]
    k = hist.shape[0] + 1
    last = (k - 1) * width
    g = prepare(geo, steps)
    for i in range(rows.shape[0]):
        base, y, e, a, d, t = locate(geo, g, rows[i], depth, k - 1)
        _put_back(dst, i, k - 1, base, y, a, d, e, t, g[0], g[1], src, src_off, hist, pad, mode,
                  width)
        _put_next(g, dst, i, last, base, y, a, e, src, src_off, term, trunc, final_idx, finals,
                  pending, width)


def stack_pairs(geo, steps, rows, depth, src, src_off, hist, pad, mode, term, trunc, final_idx,
                finals, pending, dst, nxt):
    """:func:`stacks` and :func:`next_stacks` of the same ``rows`` in one pass (no n-step): a
    row's next stack is its stack shifted by one frame, copied from ``dst`` while it is in
    cache, then its next frame; the frames are read from the storage once.

    Parameters are those of :func:`next_stacks`; ``dst`` receives the stacks and ``nxt`` (the
    same shape) the next stacks.
    """
    width = pad.shape[0]
    k = hist.shape[0] + 1
    last = (k - 1) * width
    g = prepare(geo, steps)
    for i in range(rows.shape[0]):
        base, x, e, a, d, t = locate(geo, g, rows[i], depth, k - 1)
        _put_back(dst, i, k, base, x, a, d, e, t, g[0], g[1], src, src_off, hist, pad, mode, width)
        copy_words(nxt, i * nxt.shape[1], dst, i * dst.shape[1] + width, last)
        _put_next(g, nxt, i, last, base, x, a, e, src, src_off, term, trunc, final_idx, finals,
                  pending, width)


#: the kernels of one kind, and the inline template they call (bound first)
TEMPLATES = (stacks, next_stacks, stack_pairs)
_HELPERS = (_put_next,)
_GEOMETRY = ("prepare", "locate", "final_row")


def specialize(kind: str, prefix: str) -> SimpleNamespace:
    """``stacks``, ``next_stacks`` and ``stack_pairs`` of one kind of streams, as cached kernels
    whose geometry functions are this module's ``<prefix>_<name>`` (as
    :func:`tfdata.kernels._streams.specialize` makes the windows and slices)."""
    env = dict(globals(), **{n: globals()[f"{prefix}_{n}"] for n in _GEOMETRY})
    return SimpleNamespace(kind=kind, **bind(kind, env, TEMPLATES, _HELPERS))


#: the stack kernels over a ring of interleaved streams, and over shards of streams
RING_STACKS = specialize("ring", "ring")
SHARD_STACKS = specialize("shards", "shard")


@njit(**INLINE_OPTIONS)
def _differs(a, ai, ao, b, bi, bo, width):
    # no early exit: an OR of XORs vectorises (a loop that returns at the first difference
    # compares one word per cycle); rows that differ are the rare, refused case
    if width == 0:
        return False
    acc = a[ai, ao] ^ a[ai, ao]
    for w in range(width):
        acc |= a[ai, ao + w] ^ b[bi, bo + w]
    return acc != 0


@njit(**INLINE_OPTIONS)
def _nonzero(a, ai, ao, width):
    if width == 0:
        return False
    acc = a[ai, ao] ^ a[ai, ao]
    for w in range(width):
        acc |= a[ai, ao + w]
    return acc != 0


@njit(**INLINE_OPTIONS)
def _differs_1d(a, ai, ao, b, width):
    if width == 0:
        return False
    acc = a[ai, ao] ^ a[ai, ao]
    for w in range(width):
        acc |= a[ai, ao + w] ^ b[w]
    return acc != 0


@njit(**INLINE_OPTIONS)
def _frame_differs(obs, r, o, back, num_envs, cursor, capacity, src, src_off, width):
    """Whether ``obs[r, o:o+width]`` differs from the newest frame of the row ``back`` steps
    before row ``r`` of the write: a row of the write, or a stored one."""
    q = r - back * num_envs
    if q >= 0:
        return _differs(obs, r, o, obs, q, (hist_k(obs, width) - 1) * width, width)
    s = (cursor + q) % capacity
    if s < 0:
        s += capacity
    return _differs(obs, r, o, src, s, src_off, width)


@njit(**INLINE_OPTIONS)
def hist_k(obs, width):
    return obs.shape[1] // width


@njit(**NJIT_OPTIONS)
def frame_breaks(obs, nxt, term, trunc, num_envs, cursor, capacity, src, src_off, prev, mode, pad,
                 cur):
    """The first row of a write whose stack is not what the stored frames rebuild, or -1.

    Row ``r`` (time-major, ``E = num_envs`` streams) starts an episode when its stream's previous
    row ended one (or, for the first step, ``prev[e] < 0``); its frames before the newest must
    then be the padding. Otherwise they must be the newest frames of the stream's previous rows
    (padded beyond the episode's first row). A next stack must be the stack shifted by one
    (its newest frame is checked by the elision check: against the next row's frame).

    Parameters
    ----------
    obs, nxt : ndarray of uintX, shape (n, K * width)
        The rows' stacks; ``nxt`` has 0 rows when the field has no next field.
    term, trunc : ndarray of bool, shape (n,), any stride
    cursor, capacity : int
        The slot of the write's first row; rows before it are read from ``src``.
    src : ndarray of uintX, shape (capacity, row_words)
        Stored frames at word ``src_off``.
    prev : ndarray of int16, shape (E,)
        Depth of each stream's newest stored row, -1 when the next row starts an episode.
    pad : ndarray of uintX, shape (width,)
    cur : ndarray of int16, shape (E,)
        Scratch: the streams' depths as the rows are checked (written).

    Returns
    -------
    int
        ``row * 4 + reason`` (``BREAK_PADDING``, ``BREAK_CONTINUITY``, ``BREAK_NEXT``), or -1.
    """
    width = pad.shape[0]
    k = obs.shape[1] // width
    for e in range(num_envs):
        cur[e] = prev[e]
    for r in range(obs.shape[0]):
        e = r % num_envs
        if r >= num_envs and (term[r - num_envs] or trunc[r - num_envs]):
            d = -1
        else:
            d = cur[e]
        top = (k - 1) * width
        if d < 0:  # an episode's first row: every earlier position is padding
            d = 0
            for p in range(k - 1):
                o = p * width
                if mode == PAD_RESET:
                    bad = _differs(obs, r, o, obs, r, top, width)
                elif mode == PAD_ZERO:
                    bad = _nonzero(obs, r, o, width)
                else:
                    bad = _differs_1d(obs, r, o, pad, width)
                if bad:
                    return r * 4 + BREAK_PADDING
        else:
            d = d + 1 if d + 1 < k else k - 1
            for p in range(k - 1):
                j = k - 1 - p
                o = p * width
                if j <= d:
                    bad = _frame_differs(obs, r, o, j, num_envs, cursor, capacity, src, src_off, width)
                elif mode == PAD_RESET:
                    bad = _frame_differs(obs, r, o, d, num_envs, cursor, capacity, src, src_off, width)
                elif mode == PAD_ZERO:
                    bad = _nonzero(obs, r, o, width)
                else:
                    bad = _differs_1d(obs, r, o, pad, width)
                if bad:
                    return r * 4 + BREAK_CONTINUITY
        if nxt.shape[0]:
            for p in range(k - 1):
                if _differs(nxt, r, p * width, obs, r, (p + 1) * width, width):
                    return r * 4 + BREAK_NEXT
        cur[e] = d
    return -1


@njit(**NJIT_OPTIONS)
def frames_write(obs, term, trunc, num_envs, cursor, capacity, size, steps, src, src_off, hist,
                 prev, depth):
    """Before ``n`` checked rows are written from slot ``cursor``: keep in ``hist`` the frames of
    the rows this write overwrites that a held stack still reaches, stamp the written rows'
    depths and move ``prev`` on. Reads the storage before it is overwritten.

    Parameters
    ----------
    obs : ndarray of uintX, shape (n, K * width)
        The rows' stacks (their newest frame is what the write stores).
    size, steps : int
        Rows held and steps written before this write.
    hist : ndarray of uintX, shape (K - 1, num_envs, width)
    prev : ndarray of int16, shape (num_envs,)
        As in :func:`frame_breaks`; updated.
    depth : ndarray of uint8, shape (capacity,)
        Written for the rows the write stores (the last ``capacity`` of them).
    """
    width = hist.shape[2]
    km = hist.shape[0]
    top = km * width
    n = obs.shape[0]
    m = n // num_envs
    held = capacity // num_envs
    had = size // num_envs
    t1 = steps + m
    # steps a held stack may still reach after the write: [t1 - held - km, t1 - held); keep those
    # this write evicts (held before it, or its own rows it does not store)
    lo = t1 - held - km
    if lo < steps - had:
        lo = steps - had
    if lo < 0:
        lo = 0
    for s in range(lo, t1 - held):
        h = s % km
        for e in range(num_envs):
            if s >= steps:
                r = (s - steps) * num_envs + e
                for w in range(width):
                    hist[h, e, w] = obs[r, top + w]
            else:
                slot = (cursor - (steps - s) * num_envs + e) % capacity
                if slot < 0:
                    slot += capacity
                for w in range(width):
                    hist[h, e, w] = src[slot, src_off + w]
    first = n - capacity if n > capacity else 0
    for r in range(n):
        e = r % num_envs
        d = prev[e] + 1
        if d > km:
            d = km
        if r >= first:
            depth[(cursor + r) % capacity] = d
        prev[e] = -1 if term[r] or trunc[r] else d


# refusals of :func:`frame_push` beyond ``frame_breaks``'s (``row * 4 + reason`` with row 0)
PUSH_ELIDED = 3  # the newest frame is not the previous row's next frame
PUSH_GROW = 5  # the final table has no free entry: the generic path grows it


@njit(**NJIT_OPTIONS)
def frame_push(obs, nxt, ended, p, size, steps, src, src_off, hist, pad, mode, depth, prev, final_idx,
               finals, free, n_free, pending, has_pending, episode, current):
    """One row of one stream into a frame-stacked buffer, all of it or nothing: the checks of
    ``frame_breaks`` and of elision, then the frame, the frames kept for older stacks, the
    depth, the final table, the pending next frame and the episode number.

    Parameters
    ----------
    obs, nxt : ndarray of uintX, shape (K, width)
        The row's stack and next stack, as words (every array here: the same word).
    ended : bool
        The row is terminated or truncated.
    p, size, steps : int
        The slot written, rows held and steps written before.
    src : ndarray of uintX, shape (capacity, row_words)
        Storage words; the frame at ``src_off``.
    hist : ndarray of uintX, shape (K - 1, width)
    pad : ndarray of uintX, shape (width,)
    depth : ndarray of uint8, shape (capacity,)
    prev : ndarray of int16, shape (1,)
    final_idx : ndarray of int32, shape (capacity,)
    finals : ndarray of uintX, shape (F, width)
    free : ndarray of int32, shape (F,)
        Free final-table entries, ``free[:n_free]`` (a stack).
    pending : ndarray of uintX, shape (1, width)
    has_pending : ndarray of bool, shape (1,)
    episode : ndarray of uint32, shape (capacity,)
    current : ndarray of uint32, shape (1,)

    Returns
    -------
    int
        ``< 0`` written: ``-1 - n_free`` with the number of free final-table entries after the
        write; else a refusal (``row * 4 + reason``, ``PUSH_ELIDED`` or ``PUSH_GROW``), nothing changed.
    """
    width = pad.shape[0]
    k = obs.shape[0]
    km = k - 1
    capacity = depth.shape[0]
    if p < 0 or p >= capacity or k != hist.shape[0] + 1 or obs.shape[1] != width or nxt.shape[1] != width:
        return BREAK_PADDING
    d = prev[0]
    if d < 0:
        d = 0
        for q in range(km):
            if mode == PAD_RESET:
                bad = _differs(obs, q, 0, obs, km, 0, width)
            elif mode == PAD_ZERO:
                bad = _nonzero(obs, q, 0, width)
            else:
                bad = _differs_1d(obs, q, 0, pad, width)
            if bad:
                return BREAK_PADDING
    else:
        if has_pending[0] and _differs(obs, km, 0, pending, 0, 0, width):
            return PUSH_ELIDED
        d = d + 1 if d + 1 < k else km
        for q in range(km):
            j = km - q
            back = j if j <= d else d
            if mode == PAD_RESET or j <= d:
                s = (p - back) % capacity
                bad = _differs(obs, q, 0, src, s, src_off, width)
            elif mode == PAD_ZERO:
                bad = _nonzero(obs, q, 0, width)
            else:
                bad = _differs_1d(obs, q, 0, pad, width)
            if bad:
                return BREAK_CONTINUITY
    for q in range(km):
        if _differs(nxt, q, 0, obs, q + 1, 0, width):
            return BREAK_NEXT
    old = final_idx[p]
    freed = 1 if 0 <= old < finals.shape[0] and n_free < free.shape[0] else 0
    if ended and n_free + freed == 0:
        return PUSH_GROW
    # everything checked: write
    if size == capacity:  # slot p holds step steps - capacity, which older stacks may reach
        h = (steps - capacity) % km
        for w in range(width):
            hist[h, w] = src[p, src_off + w]
    for w in range(width):
        src[p, src_off + w] = obs[km, w]
    depth[p] = d
    prev[0] = -1 if ended else d
    if freed:
        free[n_free] = old
        n_free += 1
    if ended:
        n_free -= 1
        f = free[n_free]
        if 0 <= f < finals.shape[0]:
            for w in range(width):
                finals[f, w] = nxt[km, w]
            final_idx[p] = f
        else:
            final_idx[p] = -1
    else:
        final_idx[p] = -1
    for w in range(width):
        pending[0, w] = nxt[km, w]
    has_pending[0] = not ended
    episode[p] = current[0]
    if ended:
        current[0] += 1
    return -1 - n_free


@njit(**NJIT_OPTIONS)
def frame_push_u8(obs, nxt, ended, p, size, steps, src, src_off, hist, pad, mode, depth, prev,
                  final_idx, finals, free, n_free, pending, has_pending, episode, current):
    """:func:`frame_push` for stacks as the environment gives them (C-contiguous ``(K, *frame)``
    of any dtype), compared as uint64 words: the frame's bytes must be a multiple of 8 (the
    caller checks). Reshaping here saves the caller four numpy calls on the push path."""
    k = obs.shape[0]
    o = obs.reshape((k, obs.size // k)).view(np.uint64)
    n = nxt.reshape((k, nxt.size // k)).view(np.uint64)
    return frame_push(o, n, ended, p, size, steps, src, src_off, hist, pad, mode, depth, prev,
                      final_idx, finals, free, n_free, pending, has_pending, episode, current)


# -- shards of a shared-memory region: what only a region needs ------------------------------
# A SharedReplayBuffer's shard is one writer's stream: a ring of ``cap`` slots (row ``r`` of
# shard ``s`` in slot ``s * cap + r % cap``) whose position is the shard's head. The writer's
# checks and writes above serve it with ``num_envs = 1``, ``capacity = cap`` and the shard's
# slices of the slot arrays; the stacks are :data:`SHARD_STACKS`. What a region adds: the check
# that no writer wrote a stack's rows while they were read, and a final table of fixed size
# (a ring of ``F`` entries per shard, where the one-process table grows).


@njit(**NJIT_OPTIONS)
def torn_stacks(reserved, cap, scratch, idx, depth, kmax, mark):
    """After the stacks of ``idx`` were rebuilt: which of them a writer may have been writing
    since the heads in ``scratch`` were read (``mark[i] = 1``); returns how many.

    A stack reads its row, the ``depth`` rows before it (at most ``kmax``) and the row after it
    (the next frame; for the shard's newest row, the pending frame its writer replaces when it
    writes that row): the row is torn if any of their slots is in the shard's write window.
    The frames of overwritten rows (``hist``) and final-table entries a writer replaces belong
    to rows whose own slot the same write overwrites, so they are covered too.

    Parameters
    ----------
    reserved : ndarray of uint64, shape (shards,)
    scratch : ndarray of int64, shape (>= 7 * shards,)
        The heads as :func:`tfdata.kernels._shared.snapshot_heads` read them; the windows are
        written to ``scratch[3S:7S]``.
    idx : ndarray of int64, shape (B,)
    depth : ndarray of uint8, shape (shards * cap,)
    kmax : int
        The largest ``K - 1`` of the stacked fields.
    mark : ndarray of int64, shape (B,)
    """
    fence_acquire()
    n = reserved.shape[0]
    m = windows(reserved, scratch, cap)
    torn = 0
    for i in range(idx.shape[0]):
        mark[i] = 0
        if m == 0:
            continue
        x = idx[i]
        s = x // cap
        if s < 0:
            s = 0
        elif s >= n:
            s = n - 1
        base = s * cap
        local = x - base
        if local < 0 or local >= cap:
            local = 0
        d = np.int64(depth[base + local])
        if d > kmax:
            d = kmax
        for j in range(-1, d + 1):
            q = local - j
            if q < 0:
                q += cap
            elif q >= cap:
                q -= cap
            if in_windows(scratch, n, m, base + q):
                mark[i] = 1
                break
        torn += mark[i]
    return torn


@njit(**NJIT_OPTIONS)
def final_ring_room(term, trunc, skip, r0, cap, ends, final_rows):
    """The first row of a write whose episode end would take a final-table entry that a held
    row still uses, or -1 (the table is a ring: the ``j``-th end of a shard takes entry
    ``j % F``, whose last user must have been overwritten by then).

    Parameters
    ----------
    term, trunc : ndarray of bool, shape (n,), any stride
        The write's flags; rows ``skip ..`` are stored, as rows ``r0 + skip ..`` of the shard.
    cap : int
        Slots of the shard.
    ends : int
        Episode ends the shard stored before this write.
    final_rows : ndarray of int64, shape (F,)
        The shard row each entry holds the final frame of (entries ``< ends``).
    """
    f = final_rows.shape[0]
    if f == 0:
        return -1
    j = ends
    for r in range(skip, term.shape[0]):
        if term[r] or trunc[r]:
            if j - f >= ends:  # the entry's last user is a row of this write, still held
                return r
            if j >= f and final_rows[j % f] + cap > r0 + r:
                return r
            j += 1
    return -1


@njit(**NJIT_OPTIONS)
def final_ring_write(nxt, term, trunc, skip, ends, finals, pending):
    """Keep the next frames a shard's rows do not store: the final frame of each stored row
    that ends an episode (entry ``j % F`` for the shard's ``j``-th end) and the newest row's
    next frame (``pending``). Called after :func:`final_ring_room` accepted the write.

    Parameters
    ----------
    nxt : ndarray of uintX, shape (n, K * width)
        The rows' next stacks (the newest frame is kept).
    term, trunc : ndarray of bool, shape (n,), any stride
    skip : int
        Rows of the write that are not stored (a write longer than the shard).
    ends : int
        Episode ends the shard stored before this write.
    finals : ndarray of uintX, shape (F, width)
        The shard's final table.
    pending : ndarray of uintX, shape (width,)
    """
    width = pending.shape[0]
    f = finals.shape[0]
    n = nxt.shape[0]
    top = nxt.shape[1] - width
    if n == 0 or top < 0:
        return
    j = ends
    for r in range(skip, n):
        if term[r] or trunc[r]:
            if f:
                e = j % f
                for w in range(width):
                    finals[e, w] = nxt[r, top + w]
            j += 1
    for w in range(width):
        pending[w] = nxt[n - 1, top + w]


@njit(**NJIT_OPTIONS)
def final_ring_index(term, trunc, skip, r0, ends, final_idx, final_rows):
    """Point each stored row of a write at its final-table entry (-1: not an episode end) and
    each entry at its row; returns the shard's episode ends after the write.

    Parameters
    ----------
    term, trunc : ndarray of bool, shape (n,), any stride
    skip, r0, ends : int
        As :func:`final_ring_room`.
    final_idx : ndarray of int32, shape (cap,)
        The shard's slots.
    final_rows : ndarray of int64, shape (F,)
    """
    f = final_rows.shape[0]
    cap = final_idx.shape[0]
    j = ends
    for r in range(skip, term.shape[0]):
        slot = (r0 + r) % cap
        if (term[r] or trunc[r]) and f:
            e = j % f
            final_idx[slot] = e
            final_rows[e] = r0 + r
            j += 1
        else:
            final_idx[slot] = -1
    return j
