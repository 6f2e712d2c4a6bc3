"""The parts of :class:`~tfdata.MixedReplayBuffer` that hold no state: its batch class, the split
of a batch among sources, and the checks of its sources and fractions."""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction

import numpy as np

from ..batch import Batch
from ..dataset import Dataset
from ..errors import SpecError
from .core import ReplayCore
from .samplers import shown

__all__ = ["MixedBatch", "split", "check_sources", "check_fractions", "check_shares", "refuse_short",
           "NAME", "MAX_SOURCES"]

#: a source's name: a plain word (it names a checkpoint's parts and messages)
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
MAX_SOURCES = 255  # a batch's source column is uint8


class MixedBatch(Batch):
    """A :class:`~tfdata.Batch` of rows from several sources.

    Attributes
    ----------
    source : ndarray of uint8, shape (batch_size,)
        The source number of each row (the order of ``sources``): rows ``[0, k0)`` come from
        source 0, ``[k0, k0 + k1)`` from source 1, ...
    indices : ndarray of int64, shape (batch_size,)
        Each row's row number (dataset) or slot (buffer) in its source.
    weights : ndarray of float32, shape (batch_size,)
        1 for rows of uniform sources; a prioritized source's importance weights for its rows,
        normalized as that source normalizes them alone (``(p_min / p_i) ** beta`` over its
        own tree: at most 1), per source.
    versions : ndarray of uint32, shape (batch_size,), or None
        The write versions of the rows of prioritized sources (0 for other rows); None when no
        source is prioritized.
    """

    __slots__ = ("source",)

    def __init__(self, fields, indices, source, weights, versions):
        super().__init__(fields, indices, weights, versions)
        self.source = source

    def copy(self) -> "MixedBatch":
        """A deep copy, valid forever."""
        return MixedBatch({k: v.copy() for k, v in self._fields.items()}, self.indices.copy(),
                          self.source.copy(), self.weights.copy(),
                          None if self.versions is None else self.versions.copy())


def split(batch_size: int, fractions) -> list:
    """Rows of a batch of ``batch_size`` per source, by the largest remainder method: source
    ``i`` gets ``floor(B * f_i / sum(f))`` rows, and the rows left go one each to the sources of
    the largest remainders, ties to the earlier source. Each fraction is taken as the nearest
    rational of denominator at most 10**6 and the arithmetic is exact, so 1/3 written as a
    float ties with 1/3. Deterministic, and the shares sum to ``batch_size``."""
    fr = [Fraction(f).limit_denominator(10**6) for f in fractions]
    total = sum(fr)
    quotas = [batch_size * f / total for f in fr]
    ks = [q.numerator // q.denominator for q in quotas]
    order = sorted(range(len(fr)), key=lambda i: (-(quotas[i] - ks[i]), i))
    for i in order[:batch_size - sum(ks)]:
        ks[i] += 1
    return ks


def spec_text(spec) -> str:
    """A spec as a short text for messages: ``{name: dtype[shape], ...}``."""
    return "{" + ", ".join(f"{f.name}: {f.dtype}{list(f.shape)}" for f in spec) + "}"


def check_sources(sources) -> tuple:
    """``(names, first name)`` of ``sources`` (see :class:`~tfdata.MixedReplayBuffer`), checked:
    TypeError, ValueError or SpecError naming the source and the field."""
    if not isinstance(sources, Mapping) or not 1 <= len(sources) <= MAX_SOURCES:
        raise TypeError(f"sources: expected a mapping of 1 to {MAX_SOURCES} names to sources, "
                        f"got {shown(sources)}")
    names = list(sources)
    for n in names:
        if not isinstance(n, str) or not NAME.match(n):
            raise ValueError(f"sources: name {n!r}: expected a plain word of at most 64 "
                             f"letters, digits, '_', '.', '-'")
    first = None
    for n in names:
        s = sources[n]
        if isinstance(s, ReplayCore):
            if s.transforms:  # they would see this source's rows of a batch only
                raise NotImplementedError(
                    f"sources[{n!r}]: a source's own transforms= are not applied to its rows of "
                    f"a mixed batch; give them to the mixed buffer instead: "
                    f"MixedReplayBuffer(sources, transforms=[...]) applies them to every batch")
            s.check_sample_into()
        elif not isinstance(s, Dataset):
            raise TypeError(f"sources[{n!r}]: expected a ReplayBuffer, "
                            f"PrioritizedReplayBuffer, ArrayDataset or MmapDataset, got "
                            f"{type(s).__name__}")
        else:
            s.byte_bases()  # a projected dataset has none: TypeError
            for f in s.spec:  # bytes are copied as they are: the batch's dtypes are the spec's
                if s.field(f.name).dtype != f.dtype:
                    raise TypeError(f"sources[{n!r}]: field {f.name!r} is stored as "
                                    f"{s.field(f.name).dtype}, not {f.dtype}: convert it first")
        if first is None:
            first = n
        elif s.spec != sources[first].spec:
            refuse_spec(first, sources[first].spec, n, s.spec)
    return names, first


def refuse_spec(a, sa, b, sb):
    """SpecError: sources ``a`` and ``b`` (names) have other specs ``sa``, ``sb``; names the first
    field that differs and both specs."""
    fa, fb = {f.name: f for f in sa}, {f.name: f for f in sb}
    for name in list(fa) + [n for n in fb if n not in fa]:
        x, y = fa.get(name), fb.get(name)
        if x is None or y is None or x.dtype != y.dtype or x.shape != y.shape:
            show = lambda f: "absent" if f is None else f"{f.dtype}{list(f.shape)}"  # noqa: E731
            raise SpecError(f"sources {a!r} and {b!r} differ at field {name!r} ({show(x)} "
                            f"against {show(y)}): {a}: {spec_text(sa)}; {b}: {spec_text(sb)}")
    raise SpecError(f"sources {a!r} and {b!r} hold their fields in another order: "
                    f"{a}: {spec_text(sa)}; {b}: {spec_text(sb)}")


def check_fractions(names, fractions) -> dict:
    """``{name: float}``: one fraction per source of ``names``, each in (0, 1], summing to 1
    (within 1e-6); None gives equal shares. ValueError naming the source otherwise."""
    if fractions is None:
        return {n: 1.0 / len(names) for n in names}
    if not isinstance(fractions, Mapping) or set(fractions) != set(names):
        raise ValueError(f"fractions: expected one fraction per source {list(names)}, got "
                         f"{list(fractions) if isinstance(fractions, Mapping) else shown(fractions)}")
    out = {}
    for n in names:
        f = fractions[n]
        if isinstance(f, bool) or not isinstance(f, (int, float, np.floating, np.integer)) \
                or not 0.0 < float(f) <= 1.0:
            raise ValueError(f"fractions[{n!r}]: expected a number in (0, 1], got {shown(f)}")
        out[n] = float(f)
    if abs(sum(out.values()) - 1.0) > 1e-6:
        raise ValueError(f"fractions: expected a sum of 1, got {sum(out.values())!r} "
                         f"({out})")
    return out


def check_shares(batch_size: int, ks: list, fractions: dict, sources: dict) -> None:
    """Refuse (ValueError naming the source) the shares ``ks`` of a batch of ``batch_size`` rows
    when one is 0 or above the rows its source holds (``fractions`` and ``sources`` by name, in
    batch order): before a ring is allocated."""
    for (n, s), k in zip(sources.items(), ks):
        f = fractions[n]
        if k == 0:
            raise ValueError(f"batch_size {batch_size}: source {n!r} (fraction {f:g}) would "
                             f"get 0 rows; a batch takes at least one row of every source "
                             f"(batch_size >= {int(np.ceil(1 / f))} for this one)")
        if k > len(s):
            raise ValueError(f"batch_size {batch_size}: source {n!r} holds {len(s)} rows, fewer "
                             f"than its share of {k} rows (fraction {f:g}); rows are drawn with "
                             f"replacement, but a share needs that many rows held")


def refuse_short(s, k: int, n: str, batch_size: int):
    """ValueError: source ``s`` (named ``n``) holds fewer rows than its share ``k``."""
    raise ValueError(f"source {n!r} holds {len(s)} rows, fewer than its share of {k} rows "
                     f"of a batch of {batch_size}: nothing was drawn")
