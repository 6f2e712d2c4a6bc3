"""Row copies, one per layout: all that the two layouts' kernels do differently.

``copy_field(src, idx, dst)`` sets ``dst[i] = src[idx[i]]`` for every i, ``src`` and ``dst``
being 2-D arrays of rows. AoS copies its ``uint64[capacity, words]`` record array as whole
words (:func:`copy_rows`); SoA copies each ``uint8[capacity, field_bytes]`` byte view with the
widest word that divides its row width (:func:`copy_field`). :func:`._sample.specialize` binds
one of them into the kernels of :mod:`._sample`, where numba inlines it (``inline="always"``).
"""

from __future__ import annotations

import numpy as np
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


@njit(**INLINE_OPTIONS)
def copy_field(src, idx, dst):
    """One SoA field, ``uint8[capacity, field_bytes]``, moved with the widest word that divides
    its row width: a float32[4] field moves as two 64-bit words, not sixteen bytes."""
    width = src.shape[1]
    if width % 8 == 0:
        copy_rows(src.view(np.uint64), idx, dst.view(np.uint64))
    elif width % 4 == 0:
        copy_rows(src.view(np.uint32), idx, dst.view(np.uint32))
    elif width % 2 == 0:
        copy_rows(src.view(np.uint16), idx, dst.view(np.uint16))
    else:
        copy_rows(src, idx, dst)
