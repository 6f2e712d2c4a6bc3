"""Struct-of-arrays kernels.

The storage is one C-contiguous array per field. Kernels see a tuple of byte views
``uint8[capacity, field_bytes]`` (one per field) and copy field by field, each row of a field as
one block (:func:`copy_columns`). The tuple length is part of the compiled signature: one compile
per number of fields. The kernels are :mod:`._sample`'s, specialized to this copy.

A field's row is copied by :func:`copy_row`, a :func:`._sample.row_copy` for every width of 1 to
64 bytes and the multiples of 8 to 128 (a fixed-size copy each; wider fields, such as image
frames, by ``memcpy``). It replaced a word loop (the widest word that divides the width, then a
loop over those words with a runtime width), about twice as slow. Copying every field of a row
before the next row instead of field by field was no better. Figures: reports/benchmarks.md,
"Uniform sample: where the time goes" (**SoA**).
"""

from __future__ import annotations

from numba import njit

from .._config import INLINE_OPTIONS
from ._sample import row_copy, specialize

#: one field's bytes of one row: every width of 1 to 64 bytes and the multiples of 8 to 128 by a
#: fixed-size copy; anything else by memcpy
copy_row = row_copy([*range(1, 65), *range(72, 129, 8)])


@njit(**INLINE_OPTIONS)
def copy_columns(src, idx, dst):
    """``dst[i, :] = src[idx[i], :]`` for every i for one field: C-contiguous byte views
    ``uint8[rows, field_bytes]`` of one width, a row at a time (:func:`copy_row`)."""
    nbytes = src.shape[1] * src.itemsize
    for i in range(idx.shape[0]):
        copy_row(dst, i, src, idx[i], nbytes)


gather, sample_uniform, sample_prioritized, sample_shared, sample_pool, sample_exactly_k = specialize(
    "soa", one_field=False, copy=copy_columns)

__all__ = ["gather", "sample_uniform", "sample_prioritized", "sample_shared", "sample_pool",
           "sample_exactly_k"]
