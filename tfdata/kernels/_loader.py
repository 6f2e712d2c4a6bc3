"""Kernels of the data loader: epoch permutations, block-shuffle windows, page touching, and the
prefetch thread's wait for the consumer (a spin on a published counter, without the GIL).

All of them write into arrays they are given; none allocates. Random numbers come from the same
counter-based generator as the samplers (``tfdata.kernels._rng``): draw ``k`` of an epoch is
``mix64(key + k * GOLDEN)``, so an epoch's order depends only on ``(key, dataset length)``.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .._config import INLINE_OPTIONS, NJIT_OPTIONS
from ._rng import draw_one

_TWO32 = np.uint64(1 << 32)


@njit(**INLINE_OPTIONS)
def _below(n, key, ctr):
    """One uniform draw in ``[0, n)`` (Lemire, with rejection) and the advanced counter."""
    nn = np.uint64(n)
    return draw_one(nn, (_TWO32 - nn) % nn, key, ctr)


@njit(**INLINE_OPTIONS)
def _fisher_yates(arr, m, key, ctr):
    # Durstenfeld's version, from the top: arr[i] swaps with a uniform arr[j], j in [0, i]
    for i in range(m - 1, 0, -1):
        j, ctr = _below(i + 1, key, ctr)
        t = arr[i]
        arr[i] = arr[j]
        arr[j] = t
    return ctr


@njit(**NJIT_OPTIONS)
def permutation(key, ctr, perm):
    """Fill ``perm`` with a uniform random permutation of ``0 .. len(perm) - 1``.

    Parameters
    ----------
    key, ctr : uint64
        Generator key and first counter value.
    perm : ndarray of int32 or int64, shape (n,)
        Output; ``n < 2**32``.

    Returns
    -------
    uint64
        The counter after the last draw.
    """
    for i in range(perm.shape[0]):
        perm[i] = i
    # uint64 whatever Python passed: int64 * uint64 would silently become float64 in numba
    return _fisher_yates(perm, perm.shape[0], np.uint64(key), np.uint64(ctr))


@njit(**NJIT_OPTIONS)
def window_order(blocks, b0, b1, block_rows, n, key, ctr, out):
    """Rows of blocks ``blocks[b0:b1]``, shuffled together, into ``out``.

    Parameters
    ----------
    blocks : ndarray of int32 or int64, shape (n_blocks,)
        The epoch's block order.
    b0, b1 : int
        The window's blocks, ``blocks[b0:b1]``.
    block_rows : int
        Rows per block; block ``b`` holds rows ``[b * block_rows, min((b + 1) * block_rows, n))``.
    n : int
        Rows in the dataset.
    key, ctr : uint64
        Generator key and counter.
    out : ndarray of int64, shape (>= (b1 - b0) * block_rows,)
        Output: the window's rows in shuffled order, in ``out[:m]``.

    Returns
    -------
    m : int
        Rows in the window.
    ctr : uint64
        The counter after the last draw.
    """
    m = 0
    for b in range(b0, b1):
        start = np.int64(blocks[b]) * block_rows
        stop = min(start + block_rows, n)
        for r in range(start, stop):
            out[m] = r
            m += 1
    return m, _fisher_yates(out, m, np.uint64(key), np.uint64(ctr))


@njit(**NJIT_OPTIONS)
def touch_pages(data, stride):
    """Read one byte every ``stride`` bytes of ``data`` (uint8, 1-D) so its pages are faulted in.

    Returns the sum of the bytes read, so the reads cannot be optimised away.
    """
    s = 0
    for i in range(0, data.shape[0], stride):
        s += data[i]
    if data.shape[0]:
        s += data[data.shape[0] - 1]
    return s


@intrinsic
def _load_acquire(typingctx, arr, i):
    """``arr[i]`` of a 1-D int64 array read as an atomic load with acquire ordering.

    A plain load in a loop that writes nothing is loop-invariant to LLVM, which would hoist it
    and spin on a register for ever; an atomic load is read from memory every time.
    """
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.int64
            and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        idx = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [idx])
        return builder.load_atomic(ptr, "acquire", 8)

    return types.int64(arr, i), codegen


@njit(**NJIT_OPTIONS)
def wait_change(state, i, value, spins):
    """Read ``state[i]`` up to ``spins`` times, until it differs from ``value``; without the GIL.

    The prefetch thread waits this way for the consumer to give a ring slot back: the consumer
    publishes its position with one store into ``state`` and never has to wake the thread (a
    thread wake-up costs the waker about 3 µs and the woken thread about 15 µs on the 2-core VM
    of reports/prefetch). Each read is about 0.5 ns on that VM, so ``spins=32768`` waits about
    20 µs at most; the caller loops until its own time budget is spent.

    Parameters
    ----------
    state : ndarray of int64, shape (n,)
        Counters written by another thread.
    i : int
        The counter watched.
    value : int
        Its last value seen.
    spins : int
        Reads at most.

    Returns
    -------
    int
        The new value of ``state[i]``, or ``value`` if it did not change.
    """
    for _ in range(spins):
        v = _load_acquire(state, i)
        if v != value:
            return v
    return value
