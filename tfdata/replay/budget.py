"""A replay buffer's memory: the bytes each part holds, and the budget they must fit.

:class:`Memory` counts what the parts of a buffer hold now (:attr:`Memory.parts`, the buffer's
``nbytes_parts``) and refuses, before anything is allocated, a growth that would exceed the
buffer's ``memory_budget``: a new output ring, a larger table of episode-final values, a
compressed cold block. Compressed copies are a cache of the file: they are shed, oldest first,
rather than refuse something the buffer needs.
"""

from __future__ import annotations

import contextlib
import weakref

from .._budget import check_budget
from . import planning


class Memory:
    """The bytes a buffer's parts hold, against its budget.

    Parameters
    ----------
    owner : type
        The buffer's class (``plan_memory``, for the largest capacity that fits a budget).
    plan : Plan
    budget : int or None
        Bytes the buffer may hold in all; None: no budget.
    """

    def __init__(self, owner: type, plan, budget):
        self.owner, self.plan, self.budget = owner, plan, budget
        self.parts_ = None  # the built parts (None while planning)
        self.rings = weakref.WeakSet()  # every thread's output rings

    def bind(self, parts) -> None:
        self.parts_ = parts

    @property
    def parts(self) -> dict:
        """Bytes held now, by part (see ``ReplayCore.nbytes_parts``)."""
        p, plan = self.parts_, self.plan
        storage = p.storage.nbytes if plan.hot_rows is None else plan.hot_rows * plan.row_nbytes()
        book = p.writer.nbytes + (0 if p.episodes is None else p.episodes.nbytes)
        if p.frame_stacks is not None:
            book += p.frame_stacks.nbytes
        rings = sum(r.nbytes for r in list(self.rings))
        sampler = p.sampler.nbytes
        trees = sampler["trees"] + (0 if p.stats is None else p.stats.nbytes)
        parts = {"storage": int(storage), "bookkeeping": int(book + sampler["bookkeeping"]),
                 "trees": int(trees), "output_rings": int(rings)}
        if plan.compress_cold:
            parts["cold"] = int(sum(c.nbytes for c in p.cold.values()))
        return parts

    def room(self) -> int:
        """Bytes the budget has left (for a compressed block, see ColdFrames)."""
        return self.budget - sum(self.parts.values())

    def check(self, parts: dict, what: str, construction: bool = False, lock=None) -> None:
        """MemoryBudgetError naming ``what`` unless ``parts`` fit the budget; first sheds
        compressed cold copies (under ``lock``, when given) if that makes them fit."""
        fits = None
        over = sum(parts.values()) - self.budget
        tiers = None if self.parts_ is None else self.parts_.cold
        if (over > 0 and not construction and tiers
                and over <= sum(t.compressed for t in tiers.values())):
            # compressed copies are a cache of the file: drop them (the oldest rows' first)
            # rather than refuse something the buffer needs (a refusal drops none)
            with contextlib.nullcontext() if lock is None else lock:
                freed = sum(t.shed(over) for t in tiers.values())
            parts["cold"] -= freed
        if construction and sum(parts.values()) > self.budget:
            plan = self.plan
            opts = {"layout": plan.layout, "num_envs": plan.num_envs, "n_step": plan.n_step,
                    "elide_next": plan.elide_next, "next_of": plan.next_of, "roles": plan.roles,
                    "stats": plan.stats_fields or None}
            if plan.frames is not None:
                opts.update(frame_stack=dict(plan.frames["stacks"]),
                            frame_padding=dict(plan.frames["padding"]))
            cap = planning.max_capacity(self.owner, plan.spec, self.budget, **opts)
            fits = f"the largest capacity that fits is {cap}" if cap else "no capacity fits"
        check_budget(self.budget, parts, what, fits)

    def check_construction(self) -> None:
        """Refuse a buffer whose plan does not fit (the compressed blocks are budgeted as they
        are made: see ``nbytes_parts["cold"]``)."""
        self.check(self.plan.parts(cold_bound=False),
                   f"{self.owner.__name__} of capacity {self.plan.capacity}", construction=True)

    def grow(self, extra: int) -> None:
        """Refuse (MemoryBudgetError) a growth of ``extra`` bytes that would exceed the budget."""
        if self.budget is not None:
            parts = self.parts
            parts["growth"] = extra
            self.check(parts, "growing the table of episode-final values")

    def check_ring(self, batch_size: int, length, fields, lock) -> None:
        """Refuse a new output ring that would exceed the budget (before allocating it)."""
        if self.budget is None:
            return
        parts = self.parts
        parts["new output ring"] = self.plan.ring_size * self.plan.ring_nbytes(batch_size, length, fields)
        self.check(parts, f"sampling batches of {batch_size}"
                   + (f" slices of {length} rows" if length else " rows")
                   + (f" of fields {list(fields)}" if fields is not None else ""), lock=lock)
