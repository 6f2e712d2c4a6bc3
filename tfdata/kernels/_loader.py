"""Kernels of the data loader: block-shuffle windows, page touching, and the prefetch thread's
wait for the consumer (a spin on a published counter, without the GIL).

All of them write into arrays they are given; none allocates. An epoch's permutation is
:func:`tfdata.kernels._rng.permutation`, and a window's rows are shuffled by the same
:func:`tfdata.kernels._rng.shuffle`, over the generator of the samplers: draw ``k`` of an epoch
is ``mix64(key + k * GOLDEN)``, so an epoch's order depends only on ``(key, dataset length)``.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .._config import NJIT_OPTIONS
from ._rng import shuffle


@njit(**NJIT_OPTIONS)
def window_order(blocks, b0, b1, block_rows, n, state, out):
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
    state : ndarray of uint64, shape (2,)
        ``[key, counter]``; the counter is advanced in place.
    out : ndarray of int64, shape (>= (b1 - b0) * block_rows,)
        Output: the window's rows in shuffled order, in ``out[:m]``.

    Returns
    -------
    int
        ``m``, the rows in the window.
    """
    m = 0
    for b in range(b0, b1):
        start = np.int64(blocks[b]) * block_rows
        stop = min(start + block_rows, n)
        for r in range(start, stop):
            out[m] = r
            m += 1
    state[1] = shuffle(out, m, state[0], state[1])
    return m


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
    wake-up costs both threads far more than a read: docs/design/loader.md). ``spins`` bounds the
    wait; the caller loops until its own time budget is spent.

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
