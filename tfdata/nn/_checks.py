"""Checks shared by the networks and learners of :mod:`tfdata.nn`: hyperparameter bounds, seeds,
and the fields of a loaded state dict (untrusted input: every problem a ValueError naming the
field, before anything is changed)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .._checks import check_float, check_int, float_range

# Bounds of the hyperparameters (the reasons: Adam's and PPO's docstrings, docs/design/nn.md).
LR_MAX = 1e3
EPS_MIN = float(np.finfo(np.float32).tiny)  # float32's smallest normal, 2**-126
T_MAX = 1 << 62
F32_MAX = float(np.finfo(np.float32).max)
SEED_MAX = (1 << 64) - 1


def is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def check_seed(seed) -> int | None:
    """``seed`` as None or an int in [0, 2**64)."""
    return None if seed is None else check_int("seed", seed, 0, SEED_MAX)


def check_betas(value) -> tuple[float, float] | None:
    """``value`` as two floats in [0, 1), or None if it is not that."""
    try:
        pair = tuple(value)
    except TypeError:
        return None
    if len(pair) != 2 or not all(
            not isinstance(b, bool) and isinstance(b, (int, float, np.integer, np.floating))
            and 0.0 <= b < 1.0 for b in pair):
        return None
    return float(pair[0]), float(pair[1])


# -- checks of state dicts: untrusted input, every problem a ValueError naming the field ----------
def state_error(field: str, expected: str, got: str) -> ValueError:
    return ValueError(f"state[{field!r}]: expected {expected}, got {got}")


def state_fields(state, keys, prefix: str = "") -> None:
    """``state`` is a mapping holding every key of ``keys``."""
    if not isinstance(state, Mapping):
        where = f"state[{prefix[:-1]!r}]" if prefix else "state"
        raise ValueError(f"{where}: expected a mapping, got {type(state).__name__}")
    for key in keys:
        if key not in state:
            raise ValueError(f"state: missing field {prefix + key!r}")


def state_float(field: str, value, low: float, high: float | None = None, *,
                low_open: bool = False) -> float:
    try:
        return check_float(field, value, low, low_open=low_open, high=high)
    except (TypeError, ValueError):
        raise state_error(field, f"a finite float {float_range(low, high, low_open)}",
                          repr(value)) from None


def state_int(field: str, value, low: int, high: int) -> int:
    try:
        return check_int(field, value, low, high)
    except (TypeError, ValueError):
        raise state_error(field, f"an int in [{low}, {high}]", repr(value)) from None


def state_array(field: str, value, like: np.ndarray, *, nonneg: bool = False) -> np.ndarray:
    """``value`` as floats of ``like``'s shape, finite in ``like``'s dtype (a float64 value
    beyond float32's range would turn inf when stored)."""
    expected = f"finite floats of shape {like.shape}" + (" >= 0" if nonneg else "")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):  # a ragged sequence
        raise state_error(field, expected, type(value).__name__) from None
    if arr.shape != like.shape or arr.dtype.kind != "f":
        raise state_error(field, expected, f"{arr.dtype} of shape {arr.shape}")
    bad = ~np.isfinite(arr) | (np.abs(arr) > np.finfo(like.dtype).max)
    if nonneg:
        bad |= arr < 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise state_error(field, expected, f"{float(arr.flat[i])} at index {i}")
    return arr
