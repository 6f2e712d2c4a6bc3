"""Mixed batches (:class:`tfdata.MixedReplayBuffer`): 128 rows from a dataset and 128 from a
replay buffer, both of 1M CartPole rows, beside one uniform ``sample(256)`` of the buffer and
the numpy baseline "two samples concatenated" (``buf.sample(128)``, a dataset gather of 128 rows
drawn by numpy, then ``np.concatenate`` per field), in the same run.

``layout`` is the layout of both sources (``"groups"``: :data:`benchmarks.common.GROUPINGS`),
so they share one row format: the mixed batch is in that format, each source copying its rows
as a uniform sample does. ``kind``: ``"mixed"`` the mixed buffer's ``sample(256)``,
``"uniform"`` the buffer's own ``sample(256)``, ``"uniform_columns"`` the same with ``fields=``
every field (one C-contiguous column per field, as a mixed batch of sources in different
formats holds them), ``"concat"`` the baseline. The figures and their ratios:
docs/design/mixed.md, "Measured".
"""

from __future__ import annotations

import numpy as np

import tfdata

from .common import CARTPOLE, GROUPINGS, fill_chunk, filled_buffer, warm_kernels

ROWS = 1_000_000
_MANY_SAMPLES = (200, 2000, 2.0)
_CACHE: dict = {}


def _dataset(layout):
    ds = _CACHE.get(("ds", layout))
    if ds is None:
        chunk = fill_chunk(CARTPOLE)
        reps = -(-ROWS // len(chunk["obs"]))
        data = {k: np.ascontiguousarray(np.concatenate([v] * reps)[:ROWS]) for k, v in chunk.items()}
        ds = _CACHE[("ds", layout)] = tfdata.ArrayDataset(data, layout=GROUPINGS.get(layout, layout))
    return ds


class MixedSample:
    """A batch of 256 rows: half from a dataset, half from a buffer, against one uniform sample
    of 256 and against two samples concatenated."""

    params = [["aos", "soa", "groups"], ["mixed", "uniform", "uniform_columns", "concat"]]
    param_names = ["layout", "kind"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, kind):
        warm_kernels()
        self.buf = filled_buffer(layout, CARTPOLE, ROWS)
        self.ds = _dataset(layout)
        key = ("mixed", layout)
        if key not in _CACHE:
            _CACHE[key] = tfdata.MixedReplayBuffer({"offline": self.ds, "online": self.buf},
                                                   {"offline": 0.5, "online": 0.5}, seed=0)
            _CACHE[key].sample(256)
            self.buf.sample(256)
            self.buf.sample(128)
            self.buf.sample(256, fields=CARTPOLE.names)
        self.mixed = _CACHE[key]
        self.out = _CACHE.setdefault(("out", layout), self.ds.new_output(128))
        self.rng = np.random.default_rng(0)

    def time_sample(self, layout, kind):
        if kind == "mixed":
            self.mixed.sample(256)
        elif kind == "uniform":
            self.buf.sample(256)
        elif kind == "uniform_columns":
            self.buf.sample(256, fields=CARTPOLE.names)
        else:
            b = self.buf.sample(128)
            self.ds.gather(self.rng.integers(0, ROWS, 128), self.out)
            out = self.out.fields
            {k: np.concatenate((b[k], out[k])) for k in b}

    def peakmem_sample(self, layout, kind):
        self.time_sample(layout, kind)
