"""Argument checks shared by the public constructors: a clear TypeError or ValueError naming the
argument, the expected and the given value."""

from __future__ import annotations

import math
import numbers

import numpy as np


def check_int(name: str, value, low: int, high: int | None = None) -> int:
    """``value`` as an int in ``[low, high]`` (``high`` None: no upper bound); bools refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def check_unit(name: str, value) -> float:
    """``value`` as a float in ``[0, 1]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return value


def float_range(low: float, high: float | None = None, low_open: bool = False) -> str:
    """The words of a range for messages: ``>= 0.0``, ``> 0.0``, ``in (0.0, 1000.0]``."""
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    return f"in {'(' if low_open else '['}{low}, {high}]"


def check_float(name: str, value, low: float, *, low_open: bool = False,
                high: float | None = None) -> float:
    """``value`` as a finite float ``>= low`` (``> low`` with ``low_open``) and ``<= high``
    (``high`` None: no upper bound)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if (not math.isfinite(value) or value < low or (low_open and value == low)
            or (high is not None and value > high)):
        raise ValueError(f"{name} must be finite and {float_range(low, high, low_open)}, got {value}")
    return value


def bad_slot(idx: np.ndarray, n: int):
    """The first problem of ``idx`` (a 1-D integer array) as slots of ``n`` rows: ``None`` if
    each is in ``[0, n)`` and given once, else ``(i, "range")`` for the first out of range (a
    uint64 value above 2**63 - 1 included) or ``(i, "repeat")`` for the first repeat; and the
    slots as int64 (a copy). One compiled pass (a hash set), no sort."""
    from .kernels._columns import first_bad_slot  # numba: imported when first used

    if idx.dtype.kind == "u" and idx.size and int(idx.max()) > np.iinfo(np.int64).max:
        return (int(np.argmax(idx > np.iinfo(np.int64).max)), "range"), None
    slots = idx.astype(np.int64)  # a copy: the caller's array may change after the check
    table = np.empty(max(2, 1 << (2 * slots.shape[0] - 1).bit_length()), np.int64)
    bad = first_bad_slot(slots, n, table)
    if bad < 0:
        return None, slots
    return (bad // 2, "range" if bad % 2 == 0 else "repeat"), slots


def check_slot_list(slots, size: int, what: str):
    """``slots`` (a pool read from a state dict or checkpoint) as a C-contiguous int64 array,
    each in ``[0, size)`` and given once, at most ``size`` of them; ValueError naming ``what``
    and the first slot that is not."""
    a = np.asarray(slots)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise ValueError(f"{what}: expected a 1-D integer array, got {a.dtype}{list(a.shape)}")
    if a.shape[0] > size:
        raise ValueError(f"{what}: {a.shape[0]} slots, more than the {size} rows held")
    problem, out = bad_slot(a, size)
    if problem is not None:
        i, kind = problem
        if kind == "range":
            raise ValueError(f"{what}: slot {int(a[i])} at position {i} is not a row held "
                             f"(expected 0 <= slot < {size})")
        raise ValueError(f"{what}: slot {int(a[i])} is given twice (position {i})")
    return np.ascontiguousarray(out)


def expect_array(arr, dtype, shape, what: str) -> None:
    """ValueError ``state <what>: expected <dtype><shape>, got ...`` unless ``arr`` is an ndarray
    of exactly ``dtype`` and ``shape``."""
    if not isinstance(arr, np.ndarray) or arr.dtype != dtype or arr.shape != shape:
        got = f"{arr.dtype}{arr.shape}" if isinstance(arr, np.ndarray) else type(arr).__name__
        raise ValueError(f"state {what}: expected {np.dtype(dtype)}{shape}, got {got}")
