"""Array-of-structs kernels.

The storage is one structured array whose itemsize is a multiple of 8 bytes, seen here as
``uint64[capacity, words]``. One compiled kernel serves every schema (the row width is a
runtime value), so a new schema never triggers a compile. The kernels are :mod:`._sample`'s,
specialized to :func:`copy_records`.

A row is copied as one block (:func:`copy_row`, a :func:`._sample.row_copy` for the record widths
8 to 128 bytes; wider rows go to ``memcpy``). It is about twice as fast as the loop over the
row's 64-bit words it replaced (a copy with a runtime width: LLVM vectorises it with runtime
trip-count checks, and its interleaved 8-byte loads and stores keep fewer rows' cache misses in
flight), and as fast as the whole-record assignment of the record dtype, which would compile
once per schema. Figures: reports/benchmarks.md, "Uniform sample: where the time goes".
"""

from __future__ import annotations

from numba import njit

from .._config import INLINE_OPTIONS
from ._sample import row_copy, specialize

#: whole records of 8 to 128 bytes by a fixed-size copy; anything wider by memcpy
copy_row = row_copy(range(8, 129, 8))


@njit(**INLINE_OPTIONS)
def copy_records(src, idx, dst):
    """``dst[i, :] = src[idx[i], :]`` for every i, whole rows at a time (:func:`copy_row`);
    ``src`` and ``dst`` are C-contiguous ``uint64[rows, words]`` of one width."""
    nbytes = src.shape[1] * src.itemsize
    for i in range(idx.shape[0]):
        copy_row(dst, i, src, idx[i], nbytes)


gather, sample_uniform, sample_prioritized, sample_shared, sample_pool, sample_exactly_k = specialize(
    "aos", one_field=True, copy=copy_records)

__all__ = ["gather", "sample_uniform", "sample_prioritized", "sample_shared", "sample_pool",
           "sample_exactly_k"]
