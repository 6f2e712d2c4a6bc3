"""Kernels of the data loader: epoch permutations, block-shuffle windows and page touching.

All of them write into arrays they are given; none allocates. Random numbers come from the same
counter-based generator as the samplers (``tfdata.kernels._rng``): draw ``k`` of an epoch is
``mix64(key + k * GOLDEN)``, so an epoch's order depends only on ``(key, dataset length)``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

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
