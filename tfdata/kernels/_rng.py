"""Counter-based random numbers: output ``k`` is ``mix(key + k * GOLDEN)`` (splitmix64's finaliser).

The whole generator state is two uint64 words ``state = [key, counter]``; kernels advance
``state[1]`` in place. Because output ``k`` depends only on ``(key, k)``, a restored state continues
the exact sequence, and both layouts draw the same indices for the same state.

The one shuffle of the package is here (:func:`shuffle`, :func:`permutation`): the data loader's
epochs and block windows and the rollout buffer's minibatch epochs draw their orders with it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._config import INLINE_OPTIONS, NJIT_OPTIONS

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S32 = np.uint64(32)
_LOW32 = np.uint64(0xFFFFFFFF)
_TWO32 = np.uint64(1 << 32)
_ONE = np.uint64(1)


@njit(**INLINE_OPTIONS)
def mix64(z):
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit(**INLINE_OPTIONS)
def draw_one(nn, threshold, key, ctr):
    """One uniform draw from ``[0, nn)`` (nn uint64, ``threshold = (2**32 - nn) % nn``) starting
    at word ``ctr`` of the stream ``key``; returns ``(index as int64, next counter)``.

    Lemire's multiply-shift on the top 32 bits with rejection, so every index is exactly
    equally likely (nn < 2**32).
    """
    while True:
        r = mix64(key + ctr * GOLDEN)
        ctr += _ONE
        m = (r >> _S32) * nn
        if (m & _LOW32) >= threshold:
            return np.int64(m >> _S32), ctr


@njit(**INLINE_OPTIONS)
def draw_varying(nn, key, ctr):
    """:func:`draw_one` (the same words, the same rejections, the same results) for a bound that
    changes at every draw (sampling without replacement): the rejection threshold
    ``(2**32 - nn) % nn`` is computed only when the low word is below ``nn`` (Lemire's test),
    so most draws take no division (a division per draw is most of a draw's cost)."""
    while True:
        r = mix64(key + ctr * GOLDEN)
        ctr += _ONE
        m = (r >> _S32) * nn
        low = m & _LOW32
        if low >= nn or low >= (_TWO32 - nn) % nn:
            return np.int64(m >> _S32), ctr


@njit(**INLINE_OPTIONS)
def fill_indices(n, state, idx):
    """Fill ``idx`` (int64[batch]) with uniform draws from ``[0, n)``, advancing ``state[1]``."""
    nn = np.uint64(n)
    threshold = (_TWO32 - nn) % nn
    key = state[0]
    ctr = state[1]
    for i in range(idx.shape[0]):
        idx[i], ctr = draw_one(nn, threshold, key, ctr)
    state[1] = ctr


@njit(**NJIT_OPTIONS)
def draw_indices(n, state, idx):
    """Draw uniform indices without gathering.

    Parameters
    ----------
    n : int
        Number of valid rows, ``1 <= n < 2**32``.
    state : ndarray of uint64, shape (2,)
        ``[key, counter]``; the counter is advanced in place.
    idx : ndarray of int64, shape (batch,)
        Output.
    """
    fill_indices(n, state, idx)


@njit(**INLINE_OPTIONS)
def shuffle(arr, m, key, ctr):
    """Shuffle ``arr[:m]`` in place: Durstenfeld's Fisher-Yates from the top, ``arr[i]`` swapped
    with a uniform ``arr[j]``, ``j`` in ``[0, i]``, for ``i = m - 1`` down to 1 (every order of
    the ``m`` items equally likely).

    Each ``j`` is a :func:`draw_one` (Lemire's, with rejection) starting at word ``ctr`` of the
    stream ``key``, taken by :func:`draw_varying` (the same words and results, and most draws
    without a division); returns the counter after the last draw.
    """
    for i in range(m - 1, 0, -1):
        j, ctr = draw_varying(np.uint64(i + 1), key, ctr)
        t = arr[i]
        arr[i] = arr[j]
        arr[j] = t
    return ctr


@njit(**NJIT_OPTIONS)
def permutation(state, perm):
    """Fill ``perm`` with a uniform random permutation of ``0 .. len(perm) - 1``: the identity,
    then :func:`shuffle`.

    Parameters
    ----------
    state : ndarray of uint64, shape (2,)
        ``[key, counter]``; the counter is advanced in place (one word per draw, more on a
        rejection).
    perm : ndarray of int32 or int64, shape (n,)
        Output; ``n < 2**32``.
    """
    n = perm.shape[0]
    for i in range(n):
        perm[i] = i
    state[1] = shuffle(perm, n, state[0], state[1])
