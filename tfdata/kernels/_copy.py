"""The row copy both layouts share (inlined into their kernels)."""

from __future__ import annotations

from numba import njit

from .._config import INLINE_OPTIONS


@njit(**INLINE_OPTIONS)
def copy_rows(src, idx, dst):
    """``dst[i, :] = src[idx[i], :]`` for every i; src and dst are 2-D arrays of one word type."""
    width = src.shape[1]
    for i in range(idx.shape[0]):
        j = idx[i]
        for k in range(width):
            dst[i, k] = src[j, k]
