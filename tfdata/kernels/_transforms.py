"""The sample transforms' kernels (:mod:`tfdata.transforms`): run after the gather, on a batch.

Every array argument is a field of a batch as a 2-D ``(rows, k)`` view (``k`` the elements of
one row; 1-D ``(rows,)`` for the reward), of any stride: a column of its own, or the same field
inside records. The wrappers take them through :func:`tfdata.kernels.strided` with every array
typed strided, so each kernel compiles once per dtype whatever the layout. The order of every
floating-point operation is fixed here, so AoS, SoA and any grouping give the same bits.

Nothing allocates; the outputs are the arrays the output ring holds for the transform.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._config import NJIT_OPTIONS
from ._columns import stats_summary
from ._rng import draw_one

_TWO32 = np.uint64(1 << 32)


@njit(**NJIT_OPTIONS)
def normalize(x, cnt, vals, moments, eps, has_clip, clip, out):
    """``out = (x - mean) * (1 / sqrt(var + eps))`` per element, clipped to ``[-clip, clip]``.

    Every operation in float64, the result rounded once to float32: ``r = 1 / sqrt(var + eps)``
    once per element of a row, then ``float32((x - mean) * r)`` for each row (a product, not
    a quotient: a division per value is what this kernel would spend its time on).

    Parameters
    ----------
    x : ndarray, shape (rows, k), any real dtype, any stride
        The batch's field.
    cnt, vals : ndarray of int64 (nodes,), float64 (nodes, 4, k)
        The field's statistics tree (:mod:`tfdata.kernels._columns`): its root gives mean and
        variance of the rows held now.
    moments : ndarray of float64, shape (5, k)
        Scratch: the root's mean, var, std, min, max are written here, then
        ``1 / sqrt(var + eps)`` over the std row.
    eps, clip : float
        Added to the variance; the bound (used only when ``has_clip``).
    out : ndarray of float32, shape (rows, k)
        The normalized values. A NaN stays NaN.

    Returns
    -------
    int
        The rows the statistics count (-1 for inconsistent arrays: nothing written).
    """
    n = stats_summary(cnt, vals, moments)
    rows, k = x.shape[0], x.shape[1]
    if n < 0 or moments.shape[1] < k or out.shape[0] < rows or out.shape[1] < k:
        return -1
    # one element of every row at a time: its mean and factor stay in registers, and the
    # loop over the rows has no inner loop of k (a few elements) to set up per row
    for j in range(k):
        mean = moments[0, j]
        r = 1.0 / np.sqrt(moments[1, j] + eps)
        moments[2, j] = r
        if has_clip:
            for i in range(rows):
                v = (np.float64(x[i, j]) - mean) * r
                # comparisons are False for NaN: it passes through
                out[i, j] = np.float32(-clip if v < -clip else clip if v > clip else v)
        else:
            for i in range(rows):
                out[i, j] = np.float32((np.float64(x[i, j]) - mean) * r)
    return n


@njit(**NJIT_OPTIONS)
def scale_clip(x, scale, has_clip, low, high):
    """In place, ``x[i] = clip(x[i] * scale, low, high)`` (the product in float64, rounded once
    to ``x``'s dtype; with ``has_clip`` False no clip). A NaN stays NaN.

    Parameters
    ----------
    x : ndarray of float32 or float64, shape (rows,), any stride
    scale, low, high : float
    """
    for i in range(x.shape[0]):
        v = np.float64(x[i]) * scale
        if has_clip:
            if v < low:
                v = low
            elif v > high:
                v = high
        x[i] = v


@njit(**NJIT_OPTIONS)
def cast(x, has_scale, scale, out):
    """``out = x * scale`` (the product in float64, rounded once to ``out``'s dtype) or, without
    ``has_scale``, ``out = x`` converted (a safe cast: the wrapper checks it).

    Parameters
    ----------
    x : ndarray, shape (rows, k), any stride
    scale : float
    out : ndarray, shape (rows, k), the target dtype
    """
    k = x.shape[1]
    if has_scale:
        for i in range(x.shape[0]):
            for j in range(k):
                out[i, j] = np.float64(x[i, j]) * scale
    else:
        for i in range(x.shape[0]):
            for j in range(k):
                out[i, j] = x[i, j]


@njit(**NJIT_OPTIONS)
def random_shift(x, pad, state, out):
    """DrQ's random shift: each row's images padded by ``pad`` copies of their edge rows and
    columns, then cropped back to ``(H, W)`` at an offset ``(dy, dx)`` drawn uniformly from
    ``[0, 2 * pad]`` (one offset per row, shared by its leading axes).

    The offsets are the counter RNG's bounded draws (:func:`tfdata.kernels._rng.draw_one`):
    ``dy`` then ``dx`` for row 0, then row 1, ...; ``state[1]`` is advanced in place.

    Parameters
    ----------
    x : ndarray, shape (rows, c, H, W), any dtype, any stride
        The images, channels (or stacked frames) first.
    pad : int
        ``0 <= pad``; 0 leaves the images as they are (and still draws).
    state : ndarray of uint64, shape (2,)
        ``[key, counter]``.
    out : ndarray, shape (rows, c, H, W), the dtype of ``x``
        The shifted images: ``out[b, c, y, w] = x[b, c, clamp(y + dy - pad), clamp(w + dx - pad)]``.
    """
    nn = np.uint64(2 * pad + 1)
    threshold = (_TWO32 - nn) % nn
    key = state[0]
    ctr = state[1]
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    for b in range(x.shape[0]):
        dy, ctr = draw_one(nn, threshold, key, ctr)
        dx, ctr = draw_one(nn, threshold, key, ctr)
        sh = dx - pad  # out column w reads column w + sh, clamped to [0, W - 1]
        # out columns [lo, hi) read inside the image; those before read column 0, those
        # after column W - 1
        lo = min(max(-sh, 0), W)
        hi = max(min(W - sh, W), lo)
        for c in range(C):
            for y in range(H):
                sy = min(max(y + dy - pad, 0), H - 1)
                row, dst = x[b, c, sy], out[b, c, y]
                # as views from their first index: indices from a range are known not to be
                # negative, so the copy needs no wraparound check and is vectorized
                src, mid = row[lo + sh:], dst[lo:]
                for w in range(hi - lo):
                    mid[w] = src[w]
                edge = row[0]
                for w in range(lo):
                    dst[w] = edge
                edge = row[W - 1]
                tail = dst[hi:]
                for w in range(W - hi):
                    tail[w] = edge
    state[1] = ctr
