"""Byte sizes and budgets: reading ``"400MB"``, printing sizes, refusing what exceeds a budget.

The core of :mod:`tfdata.memory`, imported by every part that checks a ``memory_budget=``
before allocating (it imports nothing of tfdata but the errors).
"""

from __future__ import annotations

import re

import numpy as np

from .errors import MemoryBudgetError

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(name: str, value) -> int:
    """Bytes from an int or a string such as ``"400MB"``, ``"1.5 GiB"``, ``"512k"``.

    Raises ValueError naming ``name`` for anything else, zero or a negative size.
    """
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]?)(i?[bB])?\s*", value) if isinstance(value, str) else None
    if not m:
        raise ValueError(f"{name}: expected bytes as an int or a string like '400MB', got {value!r}")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n < 1:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return n


def format_bytes(n: int) -> str:
    """``n`` bytes for people: ``"1.50 GiB"``, ``"12.0 MiB"``, ``"512 B"``."""
    n = int(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.2f} {unit}" if v < 10 else f"{v:.1f} {unit}"
    return f"{n} B"


def check_budget(budget: int | None, parts: dict, what: str, fits=None) -> None:
    """Raise :class:`MemoryBudgetError` if the bytes in ``parts`` (name to bytes) exceed ``budget``.

    ``fits``: the largest size that would fit, for the message (optional).
    """
    if budget is None:
        return
    total = sum(parts.values())
    if total <= budget:
        return
    detail = ", ".join(f"{k} {format_bytes(v)}" for k, v in parts.items() if v)
    hint = f"; {fits}" if fits else ""
    raise MemoryBudgetError(f"{what} needs {format_bytes(total)} ({total} bytes: {detail}), more "
                            f"than memory_budget={format_bytes(budget)} ({budget} bytes){hint}")
