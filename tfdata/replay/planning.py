"""Memory planning over buffer classes: the largest capacity that fits a budget."""

from __future__ import annotations

import numpy as np

from .._budget import parse_bytes

# Lemire's multiply-shift draws from the top 32 bits of each random word
MAX_CAPACITY = (1 << 32) - 1


def max_capacity(cls, spec, budget, *, batch_size=None, **options) -> int:
    """The largest capacity of a ``cls`` buffer of ``spec`` whose memory fits ``budget``.

    ``cls`` has ``plan_memory`` (every buffer class does); see :func:`tfdata.memory.max_capacity`
    for the arguments. Binary search over capacities in units of ``num_envs`` rows, from the
    smallest the options allow (``cls.min_capacity``): the plan grows with the capacity.
    """
    budget = parse_bytes("budget", budget)
    sizes = () if batch_size is None else ((batch_size,) if np.ndim(batch_size) == 0 else tuple(batch_size))
    step = int(options.get("num_envs", 1))
    # the smallest buffer: one step per stream, or (frame_stack) a stack of frames per stream
    least = max(1, cls.min_capacity(spec, **options) // step)

    def total(capacity: int) -> int:
        return sum(cls.plan_memory(spec, capacity, batch_sizes=sizes, **options).values())

    hi = MAX_CAPACITY // step
    if least > hi or total(least * step) > budget:
        return 0
    lo = least
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if total(mid * step) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo * step


def buffer_classes(base) -> dict:
    """``{name: class}`` of ``base`` and its subclasses defined in tfdata: the classes a
    checkpoint may name (an allow-list: a checkpoint never makes tfdata import or call anything
    else, and a user's subclass is not one of them)."""
    out, todo = {}, [base]
    while todo:
        c = todo.pop()
        if c.__module__.split(".")[0] == "tfdata" and not c.__name__.startswith("_"):
            out[c.__name__] = c
        todo.extend(c.__subclasses__())
    out.pop("ReplayCore", None)  # the core alone is no buffer
    return out
