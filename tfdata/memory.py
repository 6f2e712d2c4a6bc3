"""Memory accounting: what this process holds, and budgets for what tfdata would allocate.

:func:`snapshot` reads the process's figures (RSS, USS, peak RSS, page faults, transparent huge
pages) and the allocators' own; :func:`parse_bytes` reads sizes such as ``"400MB"``;
:func:`max_capacity` finds the largest buffer of a spec that fits a budget, counting everything
the buffer allocates (rows, episode bookkeeping, priority trees, output rings).

Sizes are in bytes; in strings ``k``, ``M``, ``G``, ``T`` are powers of 1024 (``"400MB"`` is
400 MiB), with or without ``i`` and ``B``.
"""

from __future__ import annotations

import re
import resource

import numpy as np

from .errors import MemoryBudgetError

__all__ = ["snapshot", "reset_peak", "parse_bytes", "format_bytes", "max_capacity", "check_budget"]

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


def _proc_kib(path: str, key: str) -> int:
    """The ``key:`` line of a ``/proc/self`` file, in KiB; -1 where it cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def snapshot(uss: bool = True) -> dict:
    """This process's memory now, in bytes (counts for faults); -1 where the OS does not say.

    Returns
    -------
    dict
        ``rss`` (resident set), ``uss`` (unique set: what freeing the process would return;
        psutil, costs a walk of the page tables, skipped with ``uss=False``), ``peak_rss``
        (the most ``rss`` has been: ``VmHWM``, reset by :func:`reset_peak`), ``huge`` (bytes in
        transparent huge pages), ``minor_faults`` and ``major_faults`` (since the process
        started, ``getrusage``), and ``allocators``: name to :meth:`tfdata.alloc.Allocator.stats`
        for each allocator handle loaded so far.
    """
    import psutil

    from . import alloc

    proc = psutil.Process()
    info = proc.memory_full_info() if uss else proc.memory_info()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    hwm = _proc_kib("/proc/self/status", "VmHWM")
    huge = _proc_kib("/proc/self/smaps_rollup", "AnonHugePages")
    return {
        "rss": int(info.rss),
        "uss": int(getattr(info, "uss", -1)),
        "peak_rss": hwm * 1024 if hwm >= 0 else int(ru.ru_maxrss) * 1024,
        "huge": huge * 1024 if huge >= 0 else -1,
        "minor_faults": int(ru.ru_minflt),
        "major_faults": int(ru.ru_majflt),
        "allocators": {a.name: a.stats() for a in alloc.loaded()},
    }


def reset_peak() -> bool:
    """Reset the peak RSS (``VmHWM``) to the current RSS, so a phase can be measured alone.

    Linux only (writes ``5`` to ``/proc/self/clear_refs``); returns False where that fails.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


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


def max_capacity(spec, budget, *, batch_size=None, prioritized: bool = False, **options) -> int:
    """The largest capacity of a buffer of ``spec`` whose memory fits ``budget``.

    Parameters
    ----------
    spec : Spec or mapping
    budget : int or str
        Bytes, or a string like ``"400MB"``.
    batch_size : int or sequence of int, optional
        Batch sizes that will be sampled: each adds an output ring (``ring_size`` batches).
    prioritized : bool, default False
        Size a :class:`tfdata.PrioritizedReplayBuffer` (priority trees and slot versions).
    **options
        The buffer's keyword arguments that change its memory: ``layout``, ``num_envs``,
        ``n_step``, ``next_of``, ``elide_next``, ``roles``, ``ring_size``.

    Returns
    -------
    int
        A capacity (a multiple of ``num_envs``) such that building the buffer and sampling the
        given batch sizes stays within ``budget``; 0 if not even the smallest buffer fits.
    """
    from .buffer import MAX_CAPACITY, ReplayBuffer
    from .prioritized import PrioritizedReplayBuffer

    cls = PrioritizedReplayBuffer if prioritized else ReplayBuffer
    budget = parse_bytes("budget", budget)
    sizes = () if batch_size is None else ((batch_size,) if np.ndim(batch_size) == 0 else tuple(batch_size))
    step = int(options.get("num_envs", 1))

    def total(capacity: int) -> int:
        return sum(cls.plan_memory(spec, capacity, batch_sizes=sizes, **options).values())

    lo, hi = 0, MAX_CAPACITY // step  # in units of num_envs rows; total() grows with capacity
    if total(step) > budget:
        return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if total(mid * step) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo * step
