"""Cold-tier kernels: frame stacks rebuilt with frames of blocks kept compressed in RAM.

A spilling frame-stacked buffer built with ``compress_cold=True`` keeps the frames of the blocks
of ``B`` consecutive slots that have left the hot window compressed in RAM
(:mod:`tfdata.storage.cold`); a sample reads them from there instead of the spill file. Block
``b`` holds slots ``[b*B, min((b+1)*B, capacity))``; ``cold_from[b]`` is the offset in the block
from which its compressed copy holds the slots' frames (``B`` or more: no copy; the writer moves
it up as it overwrites the block, slot by slot). A sample decompresses the blocks it needs into a
cache of ``C`` blocks (``cache``: ``(C, B, width)`` words; ``cache_map[b]``: the cache slot holding
block ``b``, or -1; ``filled[c]``: the frames of slot ``c`` decompressed, from the block's first:
a block is decompressed up to the last frame the sample reads in it, zstd stops there) and reads
their frames there.

The two kernels are the ring's ``stacks`` and ``next_stacks`` of :mod:`tfdata.kernels._frames`
(their arguments as ``cursor, steps, num_envs, capacity``; the same stacks) with a ``mode``:

* ``LIST``: write nothing; append to ``need`` (from ``count``) each compressed block the stacks
  read that is not listed yet (``mark[b] == gen``: listed), with ``reach[b]`` one more than the
  last offset read in it; return the new count;
* ``ALL``: write every position; a frame of a compressed block from the cache, skipped when its
  block is not cached;
* ``COLD``: write only the frames of compressed blocks that are cached (a later pass, once the
  cache holds the blocks an earlier pass had no room for).

So ``LIST``, then ``ALL``, then ``COLD`` passes until every listed block was cached in some pass,
writes every position exactly as the storage-only kernels do. Nothing allocates; block numbers,
cache slots and offsets are bounded before use (a frame whose block is out of range is read from
the storage).
"""

from __future__ import annotations

from numba import njit

from .._config import INLINE_OPTIONS, NJIT_OPTIONS
from ._frames import PAD_RESET, PAD_ZERO, age_depth, copy_words

LIST = 0
ALL = 1
COLD = 2


@njit(**INLINE_OPTIONS)
def _cold_frame(dst, i, o, s, src, src_off, width, cold_from, block, cache_map, cache, filled, mode,
                mark, gen, need, reach, count):
    """The frame of held slot ``s`` into ``dst[i, o:o+width]`` as ``mode`` says; the new count."""
    b = s // block
    if (b < cold_from.shape[0] and b < cache_map.shape[0] and b < mark.shape[0]
            and b < reach.shape[0] and s - b * block >= cold_from[b]):
        r = s - b * block
        if mode == LIST:
            if mark[b] != gen:
                if count < need.shape[0]:
                    mark[b] = gen
                    need[count] = b
                    reach[b] = r + 1
                    count += 1
            elif reach[b] <= r:
                reach[b] = r + 1
            return count
        c = cache_map[b]
        if (0 <= c < cache.shape[0] and c < filled.shape[0] and r < filled[c] and r < cache.shape[1]
                and width <= cache.shape[2]):
            copy_words(dst, i * dst.shape[1] + o, cache, (c * cache.shape[1] + r) * cache.shape[2],
                       width)
        return count
    if mode == ALL:
        copy_words(dst, i * dst.shape[1] + o, src, s * src.shape[1] + src_off, width)
    return count


@njit(**INLINE_OPTIONS)
def _frame_c(dst, i, o, x, a, j, e, steps, num_envs, capacity, src, src_off, hist, width, cold_from,
             block, cache_map, cache, filled, mode, mark, gen, need, reach, count):
    """``_put_frame`` of :mod:`._frames` through the cold tier."""
    held = capacity // num_envs
    if a + j < held:
        s = x - j * num_envs
        if s < 0:
            s += capacity
        return _cold_frame(dst, i, o, s, src, src_off, width, cold_from, block, cache_map, cache,
                           filled, mode, mark, gen, need, reach, count)
    if mode == ALL:
        h = (steps - 1 - a - j) % hist.shape[0]
        copy_words(dst, i * dst.shape[1] + o, hist, (h * hist.shape[1] + e) * hist.shape[2], width)
    return count


@njit(**INLINE_OPTIONS)
def _back_c(dst, i, npos, x, a, d, e, steps, num_envs, capacity, src, src_off, hist, pad, pmode,
            width, cold_from, block, cache_map, cache, filled, mode, mark, gen, need, reach, count):
    """``_put_back`` of :mod:`._frames` through the cold tier."""
    for p in range(npos):
        j = npos - 1 - p
        o = p * width
        if j <= d or pmode == PAD_RESET:  # reset padding repeats the episode's first frame
            count = _frame_c(dst, i, o, x, a, min(j, d), e, steps, num_envs, capacity, src, src_off,
                             hist, width, cold_from, block, cache_map, cache, filled, mode, mark, gen,
                             need, reach, count)
        elif mode == ALL:
            if pmode == PAD_ZERO:
                for w in range(width):
                    dst[i, o + w] = 0
            else:
                copy_words(dst, i * dst.shape[1] + o, pad, 0, width)
    return count


@njit(**NJIT_OPTIONS)
def cold_frame_stacks(rows, cursor, steps, num_envs, capacity, depth, src, src_off, hist, pad, pmode,
                      cold_from, block, cache_map, cache, filled, mode, mark, gen, need, reach, count,
                      dst):
    """:func:`~tfdata.kernels._frames.stacks` of a ring through the cold tier (see the module
    docstring).

    Parameters
    ----------
    rows ... dst
        As :func:`~tfdata.kernels._frames.stacks` (``pmode``: its padding ``mode``).
    cold_from : ndarray of int32, shape (nblocks,)
        Offset in each block from which its compressed copy is valid (``block``: none).
    block : int
        Slots per block, ``B >= 1``.
    cache_map : ndarray of int32, shape (nblocks,)
        Cache slot of each block, or -1.
    cache : ndarray of uintX, shape (C, B, width)
        Decompressed blocks.
    filled : ndarray of int64, shape (C,)
        Frames decompressed at the start of each cache slot (a block is decompressed up to the
        last frame a sample needs).
    mode : int
        ``LIST``, ``ALL`` or ``COLD``.
    mark : ndarray of int32, shape (nblocks,)
        ``LIST``: blocks listed in this sample hold ``gen`` (written).
    gen : int
    need : ndarray of int32, shape (nblocks,)
        ``LIST``: the blocks listed (written from ``count``).
    reach : ndarray of int32, shape (nblocks,)
        ``LIST``: for each block listed, one more than the last offset the stacks read in it
        (written).
    count : int
        Blocks listed so far.

    Returns
    -------
    int
        The count of blocks listed (``count`` unchanged but by ``LIST``).
    """
    width = pad.shape[0]
    k = hist.shape[0] + 1
    newest = cursor - num_envs
    if newest < 0:
        newest += capacity
    if block < 1:
        return count
    for i in range(rows.shape[0]):
        x = rows[i]
        a, d = age_depth(x, newest, num_envs, capacity, depth, k - 1)
        count = _back_c(dst, i, k, x, a, d, x % num_envs, steps, num_envs, capacity, src, src_off,
                        hist, pad, pmode, width, cold_from, block, cache_map, cache, filled, mode, mark,
                        gen, need, reach, count)
    return count


@njit(**NJIT_OPTIONS)
def cold_next_frame_stacks(rows, cursor, steps, num_envs, capacity, depth, src, src_off, hist, pad,
                           pmode, term, trunc, final_idx, finals, pending, cold_from, block,
                           cache_map, cache, filled, mode, mark, gen, need, reach, count, dst):
    """:func:`~tfdata.kernels._frames.next_stacks` of a ring through the cold tier: parameters as
    there (``pmode``: its padding ``mode``) and as :func:`cold_frame_stacks`; returns the count
    of blocks listed."""
    width = pad.shape[0]
    k = hist.shape[0] + 1
    last = (k - 1) * width
    newest = cursor - num_envs
    if newest < 0:
        newest += capacity
    if block < 1:
        return count
    for i in range(rows.shape[0]):
        y = rows[i]
        a, d = age_depth(y, newest, num_envs, capacity, depth, k - 1)
        e = y % num_envs
        count = _back_c(dst, i, k - 1, y, a, d, e, steps, num_envs, capacity, src, src_off, hist, pad,
                        pmode, width, cold_from, block, cache_map, cache, filled, mode, mark, gen, need,
                        reach, count)
        f = final_idx[y] if term[y] or trunc[y] else -1
        if 0 <= f < finals.shape[0]:
            if mode == ALL:
                copy_words(dst, i * dst.shape[1] + last, finals, f * finals.shape[1], width)
        elif a == 0:  # the newest step: its next frame is not in the ring yet
            if mode == ALL:
                copy_words(dst, i * dst.shape[1] + last, pending, e * pending.shape[1], width)
        else:
            s = y + num_envs
            if s >= capacity:
                s -= capacity
            count = _cold_frame(dst, i, last, s, src, src_off, width, cold_from, block, cache_map,
                                cache, filled, mode, mark, gen, need, reach, count)
    return count


@njit(**NJIT_OPTIONS)
def cold_assign(need, reach, start, count, cache_map, slot_block, filled, slot_used, slot_pass,
                pass_id, clock, todo):
    """Give the listed blocks ``need[start:count]`` cache slots for one pass: a block cached
    already keeps its slot; another takes the least recently used slot that no block of this
    pass holds (its previous block leaves the cache), until every slot holds a block of this
    pass.

    Parameters
    ----------
    need, reach : ndarray of int32, shape (nblocks,)
        Blocks listed by the stack kernels (``LIST``) and the frames each needs decompressed.
    start, count : int
    cache_map : ndarray of int32, shape (nblocks,)
        Cache slot of each block, or -1 (written).
    slot_block, filled, slot_used, slot_pass : ndarray of int64, shape (C,)
        Block held by each slot (-1: none), its frames decompressed, its last use (``clock``),
        the pass that used it last (written). A block cached with fewer frames than it needs
        is decompressed again into its slot.
    pass_id, clock : int
    todo : ndarray of int32, shape (C,)
        Slots whose block must be decompressed into them, ``filled`` frames (written).

    Returns
    -------
    (int, int, int)
        The index of the first block left for the next pass (``count``: none), the number of
        slots in ``todo``, the clock.
    """
    nc = slot_block.shape[0]
    nb = cache_map.shape[0]
    n = 0
    i = start
    while i < count:
        b = need[i]
        if b < 0 or b >= nb or b >= reach.shape[0]:  # not a block: nothing to cache
            i += 1
            continue
        c = cache_map[b]
        if 0 <= c < nc and slot_block[c] == b:
            if filled[c] < reach[b]:  # cached, not far enough: again, into its slot
                if n >= todo.shape[0]:
                    return i, n, clock
                filled[c] = reach[b]
                todo[n] = c
                n += 1
        else:
            c = -1
            for s in range(nc):
                if slot_pass[s] != pass_id and (c < 0 or slot_used[s] < slot_used[c]):
                    c = s
            if c < 0 or n >= todo.shape[0]:
                return i, n, clock
            old = slot_block[c]
            if 0 <= old < nb:
                cache_map[old] = -1
            slot_block[c] = b
            filled[c] = reach[b]
            cache_map[b] = c
            todo[n] = c
            n += 1
        clock += 1
        slot_used[c] = clock
        slot_pass[c] = pass_id
        i += 1
    return i, n, clock
