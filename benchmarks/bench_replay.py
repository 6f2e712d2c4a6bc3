"""Replay buffer operations: push, extend, sample, build+fill, and sampling tail latency.

Every class takes the layout as its first parameter; ``"numpy"`` is the hand-written baseline
of :mod:`benchmarks.common` (and ``"memcpy"`` the raw copy floor for image rows), so each figure
has its ratio to the baseline inside the same run. Buffers are filled before anything is timed:
the first touch of fresh memory costs page faults that would swamp the operation itself.
"""

from __future__ import annotations

import gc
from functools import partial

import psutil

from .common import (CAPACITIES, CARTPOLE, IMAGE, IMAGE_CAPACITY, LAYOUTS, build_and_fill,
                     fill_chunk, filled_buffer, first_time, memcpy_reference, one_row,
                     p99_over_median, random_rows, warm_kernels)

# every operation below is timed one call per sample (asv forces number=1 when a class has a
# setup), so take many samples: the median of thousands of single calls is stable
_MANY_SAMPLES = (200, 2000, 2.0)

_ROWS: dict = {}


def _cached_rows(key, make):
    value = _ROWS.get(key)
    if value is None:
        value = _ROWS[key] = make()
    return value


class Push:
    """Append one CartPole row, as a gymnasium step returns it, to a full buffer (cursor wraps)."""

    params = [LAYOUTS, CAPACITIES]
    param_names = ["layout", "capacity"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, capacity):
        warm_kernels()
        self.buf = filled_buffer(layout, CARTPOLE, capacity)
        self.row = _cached_rows("push", lambda: one_row(CARTPOLE, seed=2))

    def time_push(self, layout, capacity):
        self.buf.push(self.row)


class Extend:
    """Append 1000 CartPole rows (one array per field, exact dtypes) to a full buffer."""

    params = [LAYOUTS, CAPACITIES]
    param_names = ["layout", "capacity"]
    repeat = _MANY_SAMPLES
    rows = 1000

    def setup(self, layout, capacity):
        warm_kernels()
        self.buf = filled_buffer(layout, CARTPOLE, capacity)
        self.batch = _cached_rows("extend", lambda: random_rows(CARTPOLE, self.rows, seed=3))

    def time_extend(self, layout, capacity):
        self.buf.extend(self.batch)


class Sample:
    """Draw a uniform batch of CartPole rows from a full buffer."""

    params = [LAYOUTS, CAPACITIES, [32, 256, 1024]]
    param_names = ["layout", "capacity", "batch"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, capacity, batch):
        warm_kernels()
        self.buf = filled_buffer(layout, CARTPOLE, capacity)
        if first_time("sample", layout, capacity, batch):
            for _ in range(3):  # allocates this batch size's output ring
                self.buf.sample(batch)

    def time_sample(self, layout, capacity, batch):
        self.buf.sample(batch)


class SampleImage:
    """Draw 32 Atari-like rows (2 x uint8[4, 84, 84] each, 1.8 MB per batch) from 20,000.

    ``"memcpy"`` copies the same number of bytes, contiguous, from a pool as large as the
    buffer (random offset per call, so from DRAM as a sample is): the floor of any gather.
    """

    params = [LAYOUTS + ["memcpy"], [32]]
    param_names = ["layout", "batch"]
    repeat = (50, 1000, 3.0)
    timeout = 300

    def setup(self, layout, batch):
        warm_kernels()
        if layout == "memcpy":
            ref = memcpy_reference(batch * IMAGE.row_nbytes, IMAGE_CAPACITY * IMAGE.row_nbytes)
            self.op = ref.copy
        else:
            buf = filled_buffer(layout, IMAGE, IMAGE_CAPACITY)
            self.op = partial(buf.sample, batch)
        if first_time("image", layout, batch):
            for _ in range(3):
                self.op()

    def time_sample(self, layout, batch):
        self.op()


class Fill:
    """Build a buffer and fill it with ``capacity`` CartPole rows (fresh memory: page faults count).

    ``peakmem_fill`` is the process's peak RSS (numba and the kernels loaded in every case).
    """

    params = [LAYOUTS, CAPACITIES]
    param_names = ["layout", "capacity"]
    repeat = (5, 20, 10.0)
    timeout = 300

    def setup(self, layout, capacity):
        warm_kernels()
        fill_chunk(CARTPOLE)

    def time_fill(self, layout, capacity):
        build_and_fill(layout, CARTPOLE, capacity)

    def peakmem_fill(self, layout, capacity):
        build_and_fill(layout, CARTPOLE, capacity)


class FillFootprint:
    """Resident memory taken by building and filling 1M CartPole rows, over the raw data bytes.

    ``track_rss_growth_ratio`` is the RSS growth (psutil) across build+fill divided by
    ``spec.row_nbytes * capacity`` (46 MB): 1.0 means no overhead at all; the AoS record pads
    46 bytes of data to 48 (1.043). Only the 1M size is measured: smaller arrays come from
    allocator memory that is already resident, which makes the growth meaningless.
    """

    params = [LAYOUTS]
    param_names = ["layout"]
    capacity = 1_000_000
    timeout = 300

    def setup(self, layout):
        warm_kernels()
        fill_chunk(CARTPOLE)

    def track_rss_growth_ratio(self, layout):
        proc = psutil.Process()
        gc.collect()
        before = proc.memory_info().rss
        buf = build_and_fill(layout, CARTPOLE, self.capacity)
        grown = proc.memory_info().rss - before
        del buf
        return grown / (CARTPOLE.row_nbytes * self.capacity)

    track_rss_growth_ratio.unit = "ratio"


class SampleTail:
    """Tail latency of ``sample(256)`` from 1M CartPole rows: p99 over median of 2000 calls.

    Each call is timed on its own with ``perf_counter_ns``, garbage collector left on (as in a
    training loop), after 200 warm-up calls.
    """

    params = [LAYOUTS]
    param_names = ["layout"]
    capacity = 1_000_000
    batch = 256
    calls = 2000
    timeout = 300

    def setup(self, layout):
        warm_kernels()
        self.buf = filled_buffer(layout, CARTPOLE, self.capacity)
        for _ in range(200):
            self.buf.sample(self.batch)

    def track_p99_over_median(self, layout):
        sample, batch = self.buf.sample, self.batch
        return p99_over_median(lambda: sample(batch), self.calls)

    track_p99_over_median.unit = "ratio"
