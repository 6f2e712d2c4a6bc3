"""Memory accounting: what this process holds, and budgets for what tfdata would allocate.

:func:`snapshot` reads the process's figures (RSS, USS, peak RSS, page faults, transparent huge
pages) and the allocators' own; :func:`parse_bytes` reads sizes such as ``"400MB"``;
:func:`max_capacity` finds the largest buffer of a spec that fits a budget, counting everything
the buffer allocates (rows, episode bookkeeping, priority trees, output rings).

Sizes are in bytes; in strings ``k``, ``M``, ``G``, ``T`` are powers of 1024 (``"400MB"`` is
400 MiB), with or without ``i`` and ``B``.
"""

from __future__ import annotations

import resource

from ._budget import check_budget, format_bytes, parse_bytes

__all__ = ["snapshot", "reset_peak", "parse_bytes", "format_bytes", "max_capacity", "check_budget"]

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
        ``n_step``, ``next_of``, ``elide_next``, ``roles``, ``ring_size``, ``stats``,
        ``frame_stack`` and ``frame_padding`` (a stacked field counts one frame per row, plus
        its bookkeeping: a depth byte per row and ``K - 1`` frames per stream).

    Returns
    -------
    int
        A capacity (a multiple of ``num_envs``) such that building the buffer and sampling the
        given batch sizes stays within ``budget``; 0 if not even the smallest buffer fits (with
        ``frame_stack``, the smallest holds ``K`` steps per stream).
    """
    from .replay import planning
    from .replay.buffer import ReplayBuffer
    from .replay.prioritized import PrioritizedReplayBuffer

    cls = PrioritizedReplayBuffer if prioritized else ReplayBuffer
    return planning.max_capacity(cls, spec, budget, batch_size=batch_size, **options)
