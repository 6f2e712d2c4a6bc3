"""Struct-of-arrays kernels.

The storage is one C-contiguous array per field. Kernels see a tuple of byte views
``uint8[capacity, field_bytes]`` (one per field) and copy field by field, each with the widest
word that divides its row width (:func:`._copy.copy_field`), so a float32[4] field moves as two
64-bit words, not sixteen bytes. The tuple length is part of the compiled signature: one compile
per number of fields. The kernels are :mod:`._sample`'s, specialized to this copy.
"""

from __future__ import annotations

from ._copy import copy_field
from ._sample import specialize

gather, sample_uniform, sample_prioritized, sample_shared = specialize(
    "soa", one_field=False, copy=copy_field)

__all__ = ["gather", "sample_uniform", "sample_prioritized", "sample_shared"]
