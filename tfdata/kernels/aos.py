"""Array-of-structs kernels.

The storage is one structured array whose itemsize is a multiple of 8 bytes, seen here as
``uint64[capacity, words]``: a row is copied as whole 64-bit words (:func:`._copy.copy_rows`).
One compiled kernel serves every schema (the row width is a runtime value), so a new schema
never triggers a compile. The kernels are :mod:`._sample`'s, specialized to this copy.
"""

from __future__ import annotations

from ._copy import copy_rows
from ._sample import specialize

gather, sample_uniform, sample_prioritized, sample_shared = specialize(
    "aos", one_field=True, copy=copy_rows)

__all__ = ["gather", "sample_uniform", "sample_prioritized", "sample_shared"]
