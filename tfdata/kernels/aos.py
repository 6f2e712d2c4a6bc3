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
from ._tree import is_weights, stratified_find


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


@njit(**NJIT_OPTIONS)
def sample_prioritized(store, sumt, mint, version, state, beta, idx, u, weights, versions, out):
    """Stratified proportional sample with importance weights, gathered into ``out``.

    Parameters
    ----------
    store : ndarray of uint64, shape (capacity, words)
    sumt, mint : ndarray of float64, shape (2 * P,)
        Sum and min trees (see ``tfdata.kernels._tree``); the root mass must be positive.
    version : ndarray of uint64, shape (capacity,)
        Write count of every slot.
    state : ndarray of uint64, shape (2,)
        Counter-based RNG state, advanced in place (one word per draw).
    beta : float
        Importance-sampling exponent.
    idx : ndarray of int64, shape (batch,)
        Output: sampled slots.
    u : ndarray of float64, shape (batch,)
        Scratch.
    weights : ndarray of float32, shape (batch,)
        Output: ``(p_min / p_i) ** beta``, so the largest possible weight is 1.
    versions : ndarray of uint64, shape (batch,)
        Output: ``version[idx]``, to detect stale priority updates.
    out : ndarray of uint64, shape (batch, words)
        Output: the sampled rows.
    """
    stratified_find(sumt, state, idx, u)
    is_weights(sumt, mint, idx, beta, weights)
    for i in range(idx.shape[0]):
        versions[i] = version[idx[i]]
    copy_rows(store, idx, out)
