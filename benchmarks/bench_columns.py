"""Column operations: statistics of a column, extend with running statistics, reading them,
relabelling rows.

Every class takes the layout first; ``"numpy"`` is what the same work costs with numpy on a
contiguous array (the hand-written buffer of :mod:`benchmarks.common` for writes), in the same
run. Buffers hold 1M CartPole rows, filled before anything is timed.

Targets (issue 20): ``ColumnScan`` in SoA within 1.2x of numpy's reduction of a contiguous
array; ``ExtendStats`` with statistics on ``obs`` and ``reward`` at most 1.1x the same extend
without. The running statistics do their work when read, not when written: ``StatsRead``
times an extend followed by a read, the cost a loop that normalises every step pays.
"""

from __future__ import annotations

from functools import partial

import numpy as np

import tfdata

from .common import CARTPOLE, NumpyBuffer, fill, fill_chunk, filled_buffer, random_rows, warm_kernels

_MANY_SAMPLES = (200, 2000, 2.0)
CAPACITY = 1_000_000
STATS = ["obs", "reward"]

_CACHE: dict = {}


def _cached(key, make):
    value = _CACHE.get(key)
    if value is None:
        value = _CACHE[key] = make()
    return value


def stats_buffer(layout: str):
    """A full 1M-row buffer keeping statistics of ``obs`` and ``reward``, read once (so the
    first timed read does not recompute every block)."""

    def make():
        buf = tfdata.ReplayBuffer(CARTPOLE, CAPACITY, layout=layout, seed=0, stats=STATS)
        fill(buf, CAPACITY, fill_chunk(CARTPOLE))
        for name in STATS:
            buf.stats(name)
        return buf

    return _cached(("stats", layout), make)


def numpy_column(field: str) -> np.ndarray:
    """``field`` of the 1M filled rows as one contiguous array."""
    return _cached(("column", field), lambda: np.ascontiguousarray(
        np.asarray(filled_buffer("soa", CARTPOLE, CAPACITY).column(field))))


def numpy_stats(x: np.ndarray):
    """The statistics ``column_stats`` gives, as a numpy user computes them (float64)."""
    return (x.mean(0, dtype=np.float64), x.var(0, dtype=np.float64), x.min(0), x.max(0))


class ColumnScan:
    """Statistics (count, mean, var, std, min, max per element) of one field over 1M live rows:
    ``buffer.column_stats(field)``. ``"numpy"`` computes the same with numpy from a contiguous
    array (four passes: mean, var, min, max in float64); ``"numpy_mean"`` only its mean, one
    reduction (the figure ``reward.mean()`` of the issue: float32 fields accumulate in float32);
    ``"numpy_mean64"`` the mean accumulated in float64, the precision of ``column_stats``."""

    params = [["aos", "soa", "numpy", "numpy_mean", "numpy_mean64"], ["reward", "obs"]]
    param_names = ["layout", "field"]
    repeat = (20, 200, 2.0)

    def setup(self, layout, field):
        warm_kernels()
        if layout == "numpy":
            self.op = partial(numpy_stats, numpy_column(field))
        elif layout == "numpy_mean":
            self.op = partial(np.mean, numpy_column(field), 0)
        elif layout == "numpy_mean64":
            self.op = partial(np.mean, numpy_column(field), 0, np.float64)
        else:
            self.op = partial(filled_buffer(layout, CARTPOLE, CAPACITY).column_stats, field)
        self.op()

    def time_scan(self, layout, field):
        self.op()


class ExtendStats:
    """Append 1000 CartPole rows to a full buffer that keeps statistics of ``obs`` and
    ``reward`` (``stats="obs+reward"``) or none; ``"numpy"`` is the hand-written buffer's extend
    (no statistics)."""

    params = [["aos", "soa", "numpy"], ["none", "obs+reward"]]
    param_names = ["layout", "stats"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, stats):
        warm_kernels()
        if layout == "numpy" and stats != "none":
            raise NotImplementedError("the numpy baseline keeps no statistics")
        if stats == "none":
            buf = filled_buffer(layout, CARTPOLE, CAPACITY)
        else:
            buf = stats_buffer(layout)
        self.op = partial(buf.extend, _cached("batch", lambda: random_rows(CARTPOLE, 1000, seed=3)))

    def time_extend(self, layout, stats):
        self.op()


class _Welford:
    """The numpy baseline of running statistics: mean and M2 of ``obs`` and ``reward`` kept at
    each extend, the overwritten rows removed and the new ones added by Chan's formulas (no
    min or max: those cannot be kept this way)."""

    def __init__(self, buf: NumpyBuffer):
        self.buf = buf
        self.n = buf.size
        self.mean = {k: buf.arrays[k].mean(0, dtype=np.float64) for k in STATS}
        self.m2 = {k: buf.arrays[k].var(0, dtype=np.float64) * self.n for k in STATS}

    def extend(self, batch: dict) -> None:
        buf, n, total = self.buf, len(batch["reward"]), self.n  # a full buffer: total stays
        at = (buf.cursor + np.arange(n)) % buf.capacity  # the rows this extend overwrites
        for k in STATS:
            old = buf.arrays[k][at].astype(np.float64)
            new = batch[k].astype(np.float64)
            mo, mn = old.mean(0), new.mean(0)
            rest = total - n  # remove the old rows ...
            mean = (total * self.mean[k] - n * mo) / rest
            m2 = self.m2[k] - ((old - mo) ** 2).sum(0) - (mo - mean) ** 2 * rest * n / total
            d = mn - mean  # ... add the new ones
            self.mean[k] = mean + d * n / total
            self.m2[k] = m2 + ((new - mn) ** 2).sum(0) + d * d * rest * n / total
        buf.extend(batch)

    def read(self, name: str):
        return self.mean[name], self.m2[name] / self.n


class StatsRead:
    """Extend 1000 rows, then read the statistics of ``obs`` and ``reward`` (what a loop that
    normalises at every step pays: the running statistics recompute the blocks written since
    the previous read). ``"numpy"`` keeps mean and variance at each extend with numpy
    (:class:`_Welford`, no min or max), then reads them."""

    params = [["aos", "soa", "numpy"]]
    param_names = ["layout"]
    repeat = _MANY_SAMPLES

    def setup(self, layout):
        warm_kernels()
        batch = _cached("batch", lambda: random_rows(CARTPOLE, 1000, seed=3))
        if layout == "numpy":
            w = _cached("welford", lambda: _Welford(filled_buffer("numpy", CARTPOLE, CAPACITY)))
            self.extend, self.read = partial(w.extend, batch), w.read
        else:
            buf = stats_buffer(layout)
            self.extend, self.read = partial(buf.extend, batch), buf.stats

    def time_extend_and_read(self, layout):
        self.extend()
        self.read("obs")
        self.read("reward")


class UpdateField:
    """Rewrite ``reward`` of 256 random live rows of a full buffer in place
    (``update_field``), in a buffer without statistics or keeping statistics of ``reward``;
    ``time_update_and_read`` adds the next statistics read (where relabelled blocks are
    recomputed). ``"numpy"`` is fancy assignment into a contiguous column (``arr[idx] = v``)."""

    params = [["aos", "soa", "numpy"], ["none", "reward"]]
    param_names = ["layout", "stats"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, stats):
        warm_kernels()
        if layout == "numpy" and stats != "none":
            raise NotImplementedError("the numpy baseline keeps no statistics")
        rng = np.random.default_rng(5)
        idx = rng.choice(CAPACITY, 256, replace=False)
        values = rng.standard_normal(256).astype(np.float32)
        self.read = None
        if layout == "numpy":
            col = numpy_column("reward").copy()
            self.op = partial(col.__setitem__, idx, values)
        else:
            buf = filled_buffer(layout, CARTPOLE, CAPACITY) if stats == "none" else stats_buffer(layout)
            self.op = partial(buf.update_field, "reward", idx, values)
            if stats != "none":
                self.read = partial(buf.stats, "reward")

    def time_update(self, layout, stats):
        self.op()

    def time_update_and_read(self, layout, stats):
        self.op()
        if self.read is not None:
            self.read()
