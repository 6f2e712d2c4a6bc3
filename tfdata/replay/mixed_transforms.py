"""Transforms on sample for a :class:`~tfdata.MixedReplayBuffer`: the list checked against the
mixed batch's spec, bound once to parts over the mixed batch's fields, and the statistics a
:class:`~tfdata.Normalize` reads.

A mixed buffer keeps no running statistics of its own: its rows are its sources'. ``stats_from``
names the dataset source whose statistics ``Normalize`` uses: those of every row of the
dataset, computed once when the mixed buffer is built (a dataset's rows never change) by the
running-statistics trees and kernels a buffer's ``stats=`` keeps, so they are the values a
:class:`~tfdata.ReplayBuffer` holding exactly those rows gives. The design:
docs/design/mixed.md ("Transforms on sample").
"""

from __future__ import annotations

import numpy as np

from ..errors import MemoryBudgetError
from ..transforms import Context, Normalize, SampleTransform, check_states, check_transforms
from .columns import RunningStats, check_stats_fields, stats_nbytes
from .core import ReplayCore
from .episodes import resolve_roles
from .samplers import StateError, shown

__all__ = ["MixedTransforms", "DatasetStats"]


class DatasetStats:
    """The statistics of every row of a dataset, computed once: what a ``Normalize`` part reads
    (``sync()``, a no-op, and ``tree(name)``).

    Parameters
    ----------
    dataset : Dataset
        Read-only rows (``field(name)``: ``(len, *shape)``, any stride).
    names : tuple of str
        Numeric fields (:func:`~tfdata.replay.columns.check_stats_fields`).
    allocator
        Gives the trees (counted by :attr:`nbytes`).
    """

    def __init__(self, dataset, names: tuple, allocator):
        self.dataset = dataset
        # what RunningStats reads of its writer: every row held, none moving, no lap
        self.cursor, self.size, self.moving = 0, len(dataset), 0
        self.stats = RunningStats(dataset.spec, names, len(dataset), allocator)
        self.stats.bind(self, self)
        self.stats.rebuild()

    def column(self, name: str) -> np.ndarray:
        """Field ``name`` as a ``(len, k)`` view (never a copy): what the column kernels read."""
        return np.reshape(self.dataset.field(name), (self.size, -1), copy=False)

    def sync(self) -> None:
        """Nothing: the rows never change."""

    def tree(self, name: str) -> tuple:
        return self.stats.tree(name)

    def read(self, name: str):
        return self.stats.read(name)

    @property
    def nbytes(self) -> int:
        return self.stats.nbytes


class MixedTransforms:
    """The ``transforms=`` of a mixed buffer: checked, their statistics, their bound parts.

    Parameters
    ----------
    spec : Spec
        The sources' (every mixed batch's fields).
    sources : dict
        ``{name: source}``, in batch order.
    transforms : list of SampleTransform, or None
    roles : dict, optional
        ``{role: field}`` as for :class:`~tfdata.ReplayBuffer` (``reward``, for
        :class:`~tfdata.ScaleReward` and :class:`~tfdata.ClipReward`).
    stats_from : str, optional
        The dataset source whose statistics a ``Normalize`` reads; required with one, refused
        without.
    allocator, budget
        Where the statistics' trees come from, and the bytes they may take (None: no limit).

    Raises
    ------
    TypeError, ValueError, SpecError, MemoryBudgetError, NotImplementedError
        Naming the transform, field or option; nothing is allocated.
    """

    def __init__(self, spec, sources: dict, transforms, roles=None, stats_from=None,
                 allocator=None, budget=None):
        if transforms is not None and not isinstance(transforms, SampleTransform) \
                and hasattr(transforms, "__iter__"):
            transforms = list(transforms)  # read once (a generator)
        listed = transforms if isinstance(transforms, list) else []
        self.roles = resolve_roles(spec, roles)
        wanted = tuple(dict.fromkeys(t.stats_of for t in listed if isinstance(t, Normalize)))
        if stats_from is not None:
            if not isinstance(stats_from, str) or stats_from not in sources:
                raise ValueError(f"stats_from: expected the name of a dataset source "
                                 f"{list(sources)}, got {shown(stats_from)}")
            if isinstance(sources[stats_from], ReplayCore):
                raise NotImplementedError(
                    f"stats_from={stats_from!r}: a buffer source's running statistics are not "
                    f"read by a mixed buffer (they change with its writes, under its own lock); "
                    f"name a dataset source, whose statistics are computed once")
            if not wanted:
                raise ValueError(f"stats_from={stats_from!r}: no Normalize transform reads "
                                 f"statistics; leave stats_from out")
        elif wanted:
            raise ValueError(
                f"Normalize({wanted[0]!r}): a mixed buffer keeps no running statistics of its "
                f"own; name the dataset source whose statistics to use: stats_from='<name>' "
                f"(computed once over its rows), or normalize in the sources before mixing")
        self.stats_fields = check_stats_fields(spec, spec, wanted, {}, False)
        self.ctx = Context(spec, self.roles, self.stats_fields)
        self.transforms = check_transforms(transforms, self.ctx)
        self.stats_from, self.stats = stats_from, None
        if wanted:
            ds = sources[stats_from]
            need = stats_nbytes(spec, self.stats_fields, len(ds))
            if budget is not None and need > budget:
                raise MemoryBudgetError(f"memory_budget {budget} bytes: the statistics of "
                                        f"{list(self.stats_fields)} over source {stats_from!r} "
                                        f"need {need} bytes")
            self.stats = DatasetStats(ds, self.stats_fields, allocator)
        bound = Context(spec, self.roles, self.stats_fields, (), self.stats, allocator)
        self.parts = tuple(t.bind(bound) for t in self.transforms)

    @property
    def nbytes(self) -> int:
        """Bytes of the statistics' trees (0 without)."""
        return 0 if self.stats is None else self.stats.nbytes

    def ring_nbytes(self, rows: int, fields=None) -> int:
        """Bytes the parts add to one ring slot of ``rows`` rows (``fields``: a projection's)."""
        return int(sum(t.ring_nbytes(self.ctx, rows, fields) for t in self.transforms))

    def project(self, names) -> tuple:
        """The parts for batches of the fields ``names`` (ValueError, before any allocation,
        when a projection holds some of a transform's fields)."""
        return tuple(p.project(names) for p in self.parts)

    def config(self) -> dict:
        """``{"transforms", "stats_from", "roles"}``: what rebuilds them (with the functions)."""
        return {"transforms": [t.config() for t in self.transforms], "stats_from": self.stats_from,
                "roles": dict(self.roles)}

    def unsaved_reason(self) -> str | None:
        for t in self.transforms:
            reason = t.unsaved_reason()
            if reason is not None:
                return reason
        return None

    def state_dict(self) -> list:
        return [p.state_dict() for p in self.parts]

    def check_state(self, states) -> list:
        """Each part's state checked (untrusted); :class:`StateError` naming ``transforms``."""
        try:
            return check_states(list(self.parts), states)
        except (ValueError, TypeError) as exc:
            raise StateError("transforms", "one state per transform, as state_dict() gives",
                             str(exc)[:300]) from None

    def load_state(self, checked: list) -> None:
        for p, s in zip(self.parts, checked):
            p.load_state(s)
