"""Row copies, one set per layout: all that the two layouts' kernels do differently.

AoS stores are ``uint64[capacity, words]`` (a row copied as whole words), SoA stores a tuple of
``uint8[capacity, field_bytes]`` byte views (copied field by field, each with the widest word
that divides its row width). Each layout has three functions, bound into the kernels of
:mod:`._sample` by :func:`._sample.specialize` and inlined there (``inline="always"``):

``copy(store, idx, out)``
    ``out[i] = store[idx[i]]`` for every i (:func:`copy_rows`, :func:`copy_fields`).
``redraw(store, idx, out, i)``
    The same for row ``i`` alone (:func:`redraw_aos`, :func:`redraw_soa`).
``rows(store, at_most)``
    ``min(at_most, rows of the store)`` (:func:`rows_aos`, :func:`rows_soa`).

Written as the layouts' kernels wrote them before they were unified: the kernels compile to the
same machine code (a copy with a row offset, or a local bound to ``store[f]``, changes it).
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
def redraw_aos(store, idx, out, i):
    copy_rows(store, idx[i:i + 1], out[i:i + 1])


@njit(**INLINE_OPTIONS)
def rows_aos(store, at_most):
    return min(at_most, store.shape[0])


@njit(**INLINE_OPTIONS)
def _copy_field(src, idx, dst):
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


@njit(**INLINE_OPTIONS)
def copy_fields(store, idx, out):
    for f in range(len(store)):
        _copy_field(store[f], idx, out[f])


@njit(**INLINE_OPTIONS)
def redraw_soa(store, idx, out, i):
    for f in range(len(store)):
        _copy_field(store[f], idx[i:i + 1], out[f][i:i + 1])


@njit(**INLINE_OPTIONS)
def rows_soa(store, at_most):
    rows = at_most
    for f in range(len(store)):
        rows = min(rows, store[f].shape[0])
    return rows
