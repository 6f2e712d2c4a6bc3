"""Array-of-structs kernels.

The storage is one structured array whose itemsize is a multiple of 8 bytes, seen here as
``uint64[capacity, words]``: a row is copied as whole 64-bit words. One compiled kernel serves
every schema (the row width is a runtime value), so a new schema never triggers a compile.
"""

from __future__ import annotations

from numba import njit

from .._config import NJIT_OPTIONS
from ._copy import copy_rows
from ._rng import fill_indices


@njit(**NJIT_OPTIONS)
def gather(store, idx, out):
    """Copy rows ``store[idx]`` into ``out``.

    Parameters
    ----------
    store : ndarray of uint64, shape (capacity, words)
        The record array viewed as 64-bit words.
    idx : ndarray of int64, shape (batch,)
        Row numbers, each in ``[0, capacity)`` (checked by the caller).
    out : ndarray of uint64, shape (>= batch, words)
        Destination rows.
    """
    copy_rows(store, idx, out)


@njit(**NJIT_OPTIONS)
def sample_uniform(store, n, state, idx, out):
    """Draw ``len(idx)`` uniform row numbers in ``[0, n)`` into ``idx`` and gather them into ``out``.

    Parameters
    ----------
    store : ndarray of uint64, shape (capacity, words)
    n : int
        Number of valid rows, ``1 <= n <= capacity``.
    state : ndarray of uint64, shape (2,)
        Counter-based RNG state ``[key, counter]``; advanced in place.
    idx : ndarray of int64, shape (batch,)
        Output: the sampled row numbers.
    out : ndarray of uint64, shape (batch, words)
        Output: the sampled rows.
    """
    fill_indices(n, state, idx)
    copy_rows(store, idx, out)
