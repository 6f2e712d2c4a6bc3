"""Episode-aware replay: n-step sampling, next-field elision and sequence slices.

What each class measures, with the layout as its first parameter:

* ``NStepSample``: ``sample(batch)`` of CartPole rows, plain (``"uniform"``) and with 3-step
  returns (``"nstep3"``) on the same data, so their ratio is read in one run.
  Target: nstep3 <= 2x uniform at batch 256.
* ``NStepPrioritized``: the same pair for ``PrioritizedReplayBuffer.sample(256)`` at 1M rows.
* ``ElisionMemory``: ``buf.nbytes`` (rows + episode bookkeeping) of a full buffer stored in full
  or with ``next_obs`` elided, per row, and the peak RSS of building and filling one.
  Target: elided <= 0.6x full (the image rows meet it; CartPole cannot: ``obs`` is 16 of its
  46 bytes, so eliding ``next_obs`` saves at most 35%).
* ``ElisionSample``: ``sample(256)``, full against elided (``next_obs`` read from the stream's
  next row, the final-observation table or the pending row).
* ``Sequences``: ``sample_sequences(32, 16)``, ``policy="mask"`` against ``"reject"``, next to
  ``sample(512)`` (the same number of rows drawn independently) as the gather floor.

The data are *consistent episode streams*, as an environment produces them (and as
``elide_next=True`` requires): within an episode ``obs[t + 1] == next_obs[t]``; an episode ends
with ``terminated`` (or, one time in ten, ``truncated``) and carries its own final
observation; the next episode starts from a fresh random ``obs``. Episode lengths are random
with a fixed mean (200 steps for CartPole, 1000 for the image rows). One block of rows is built
per spec and process, and its last row always ends an episode, so the block can be extended
again and again and the stream stays continuous. Filling extends consecutive slices of it.

As everywhere in this suite, asv_runner calls ``setup`` before every timed call (see
:mod:`benchmarks.common`): filled buffers are built once per process and kept in a
module-level cache, the kernels are loaded once per (layout, spec, mode), and the first samples
of each batch size (which allocate its output ring) happen before timing.
"""

from __future__ import annotations

import gc
from functools import partial

import numpy as np
import psutil

import tfdata

from .common import CARTPOLE, IMAGE, IMAGE_CAPACITY, TFDATA_LAYOUTS, first_time, warm_kernels

# every sample below is timed one call per reading (asv forces number=1 when a class has a
# setup), so take many readings: the median of thousands of single calls is stable
_MANY_SAMPLES = (200, 2000, 2.0)

SPECS = {"cartpole": CARTPOLE, "image": IMAGE}
#: capacity of the buffers of each spec where the benchmark does not choose it
SPEC_CAPACITY = {"cartpole": 1_000_000, "image": IMAGE_CAPACITY}
#: mean episode length, in steps
MEAN_EPISODE = {"cartpole": 200, "image": 1000}
#: rows of the block of consistent rows built once per process: a multiple of the mean
#: episode length (500 CartPole episodes, 4 image episodes of random lengths)
_BLOCK_ROWS = {"cartpole": 100_000, "image": 4_000}
#: rows per extend when filling: a few MB per call, so that the input block (the only
#: temporary of a fill) stays small next to the buffer whose peak memory is measured
_EXTEND_ROWS = {"cartpole": 25_000, "image": 1_000}

GAMMA = 0.99
#: buffer options of each mode
MODES = {
    "uniform": {},
    "nstep3": {"n_step": 3, "gamma": GAMMA},
    "full": {},
    "elided": {"elide_next": True},
}


# -- data -------------------------------------------------------------------------------------
def stream_rows(spec: tfdata.Spec, n: int, mean_length: int, seed: int = 0) -> dict:
    """``n`` consecutive rows of one environment stream, ``n / mean_length`` episodes of them.

    Episode ends are the last row plus ``n / mean_length - 1`` rows drawn uniformly without
    replacement, so lengths are random (close to geometric) with mean exactly ``mean_length``
    when it divides ``n``. Within an episode ``obs[t + 1] == next_obs[t]``; an ending row's
    ``next_obs`` (its final observation) is random, and so is the first ``obs`` of the next
    episode. Nine ends in ten are ``terminated``, the others ``truncated``, the last row
    ``terminated``. Rewards are N(0, 1), actions 0 or 1. Every array has its field's dtype.
    """
    rng = np.random.default_rng(seed)
    n_episodes = max(1, round(n / mean_length))
    ends = np.zeros(n, bool)
    ends[rng.choice(n - 1, n_episodes - 1, replace=False)] = True
    ends[-1] = True
    truncated = ends & (rng.random(n) < 0.1)
    truncated[-1] = False
    terminated = ends & ~truncated

    def draw(name, rows):
        f = spec[name]
        shape = (rows,) + f.shape
        if f.dtype.kind == "u" and f.dtype.itemsize == 1:
            return rng.integers(0, 256, shape, dtype=f.dtype)
        return rng.standard_normal(shape, dtype=np.float32).astype(f.dtype, copy=False)

    obs = draw("obs", n)
    next_obs = np.empty_like(obs)
    next_obs[:-1] = obs[1:]
    next_obs[ends] = draw("next_obs", int(ends.sum()))
    out = {
        "obs": obs,
        "action": rng.integers(0, 2, n, dtype=spec["action"].dtype),
        "reward": draw("reward", n),
        "next_obs": next_obs,
        "terminated": terminated,
        "truncated": truncated,
    }
    assert set(out) == set(spec.names), (sorted(out), spec.names)
    return {name: out[name] for name in spec.names}


_BLOCKS: dict = {}


def stream_block(kind: str) -> dict:
    """The cached block of consistent rows of ``kind`` ("cartpole" or "image")."""
    block = _BLOCKS.get(kind)
    if block is None:
        block = _BLOCKS[kind] = stream_rows(SPECS[kind], _BLOCK_ROWS[kind], MEAN_EPISODE[kind],
                                            seed=1)
    return block


def fill_streams(buf, capacity: int, kind: str) -> None:
    """Extend ``buf`` with ``capacity`` rows of one continuous stream (the block, repeated)."""
    block = stream_block(kind)
    block_rows = _BLOCK_ROWS[kind]
    step = _EXTEND_ROWS[kind]
    done = 0
    while done < capacity:
        start = done % block_rows
        n = min(step, capacity - done, block_rows - start)
        buf.extend({name: v[start:start + n] for name, v in block.items()})
        done += n


# -- buffers ----------------------------------------------------------------------------------
def new_episode_buffer(layout: str, kind: str, capacity: int, mode: str, *,
                       prioritized: bool = False, seed: int = 0):
    """An empty ``ReplayBuffer`` (or ``PrioritizedReplayBuffer``) of ``kind`` rows in ``mode``."""
    cls = tfdata.PrioritizedReplayBuffer if prioritized else tfdata.ReplayBuffer
    return cls(SPECS[kind], capacity, layout=layout, seed=seed, **MODES[mode])


def build_and_fill_streams(layout: str, kind: str, capacity: int, mode: str, *,
                           prioritized: bool = False):
    buf = new_episode_buffer(layout, kind, capacity, mode, prioritized=prioritized)
    fill_streams(buf, capacity, kind)
    return buf


def initial_priorities(capacity: int) -> np.ndarray:
    """|N(0, 1)| per slot, like absolute TD errors (as in :mod:`benchmarks.bench_prioritized`)."""
    return np.abs(np.random.default_rng(4).standard_normal(capacity))


_FILLED: dict = {}


def filled_streams(layout: str, kind: str, capacity: int, mode: str, *,
                   prioritized: bool = False):
    """A full buffer of consistent streams, built once per process and cached.

    A prioritized buffer also gets random priorities over every slot, so its trees are not
    flat when timing starts.
    """
    key = (layout, kind, capacity, mode, prioritized)
    buf = _FILLED.get(key)
    if buf is None:
        buf = build_and_fill_streams(layout, kind, capacity, mode, prioritized=prioritized)
        if prioritized:
            buf.update_priorities(np.arange(capacity, dtype=np.int64),
                                  initial_priorities(capacity))
        _FILLED[key] = buf
    return buf


def check_elision(layout: str, kind: str) -> None:
    """A small elided buffer samples exactly what the full one does (same seed, same rows).

    The rows wrap the ring once, so some next values come from the final-observation table,
    one from the pending row and the rest from the next row. Raises AssertionError if not.
    """
    capacity = 4096 if kind == "cartpole" else 96
    full = build_and_fill_streams(layout, kind, capacity, "full")
    elided = build_and_fill_streams(layout, kind, capacity, "elided")
    block = stream_block(kind)
    extra = {name: v[capacity:capacity + capacity // 3] for name, v in block.items()}
    full.extend(extra)
    elided.extend(extra)
    for _ in range(3):
        a, b = full.sample(64), elided.sample(64)
        assert np.array_equal(a.indices, b.indices)
        for name in SPECS[kind].names:
            assert np.array_equal(a[name], b[name]), (layout, kind, name)


def warm_episode_kernels(layout: str, kind: str, mode: str, *, prioritized: bool = False) -> None:
    """Load (or compile) the kernels this (layout, spec, mode) uses, once per process.

    The common kernels are warmed first (:func:`benchmarks.common.warm_kernels`), so every
    process being compared has the same code resident; then a small buffer of the same
    layout, spec and options is filled and sampled (n-step windows, elided reads, sequence
    slices, episode stamping), and the elided mode is checked against the full one.
    """
    warm_kernels()
    if not first_time("episode-kernels", layout, kind, mode, prioritized):
        return
    capacity = 4096 if kind == "cartpole" else 64
    buf = build_and_fill_streams(layout, kind, capacity, mode, prioritized=prioritized)
    buf.sample(32)
    if not prioritized:
        buf.sample_sequences(4, 4, policy="mask")
        buf.sample_sequences(4, 4, policy="reject")
    if mode == "elided":
        check_elision(layout, kind)


def warm_batch(buf, key, batch: int, calls: int = 3) -> None:
    """First samples of this batch size on ``buf`` (allocates its output ring), once per key."""
    if first_time("batch", *key, batch):
        for _ in range(calls):
            buf.sample(batch)


# -- benchmarks -------------------------------------------------------------------------------
class NStepSample:
    """``sample(batch)`` of CartPole rows from a full buffer, plain and with 3-step returns.

    ``"uniform"``: ``ReplayBuffer`` without ``n_step`` (it still stamps episode numbers at
    insert, but sampling is the plain gather). ``"nstep3"``: ``n_step=3, gamma=0.99`` on the
    same rows: the gather, then the windows (returns, flags and discounts of up to 3 rows of
    the stream, stopping at episode ends) and ``next_obs`` re-read at each window's last row.
    Episodes have a mean of 200 steps. Target: nstep3 <= 2x uniform at batch 256.
    """

    params = [TFDATA_LAYOUTS, [10_000, 1_000_000], [32, 256], ["uniform", "nstep3"]]
    param_names = ["layout", "capacity", "batch", "mode"]
    repeat = _MANY_SAMPLES
    timeout = 300

    def setup(self, layout, capacity, batch, mode):
        warm_episode_kernels(layout, "cartpole", mode)
        self.buf = filled_streams(layout, "cartpole", capacity, mode)
        warm_batch(self.buf, ("nstep", layout, capacity, mode), batch)

    def time_sample(self, layout, capacity, batch, mode):
        self.buf.sample(batch)


class NStepPrioritized:
    """``PrioritizedReplayBuffer.sample(256)`` from 1M CartPole rows with random priorities,
    without (``"uniform"``: the plain prioritized sample) and with ``n_step=3``.

    The sampled slot is the window's first row (its priority); the windows are computed after
    the stratified draw and gather, as for the uniform buffer.
    """

    params = [TFDATA_LAYOUTS, ["uniform", "nstep3"]]
    param_names = ["layout", "mode"]
    repeat = _MANY_SAMPLES
    timeout = 300
    capacity = 1_000_000
    batch = 256

    def setup(self, layout, mode):
        warm_episode_kernels(layout, "cartpole", mode, prioritized=True)
        self.buf = filled_streams(layout, "cartpole", self.capacity, mode, prioritized=True)
        warm_batch(self.buf, ("prioritized", layout, mode), self.batch)

    def time_sample(self, layout, mode):
        self.buf.sample(self.batch)


class ElisionMemory:
    """Memory of a full buffer with ``next_obs`` stored (``"full"``) or elided (``"elided"``).

    ``track_nbytes``: ``buf.nbytes`` (row storage plus episode bookkeeping: episode numbers,
    and with elision the final-observation table, its index and the pending rows) after
    filling 1M CartPole rows or 20,000 image rows. ``track_bytes_per_row``: the same over the
    capacity. ``peakmem_fill``: peak RSS of the process that builds and fills such a buffer
    (numba, the kernels and the block of rows it is filled from, about 9 MB or 226 MB, are
    included in every mode). ``track_fill_rss``: the RSS growth across the build and fill
    alone (psutil), free of those constants.
    Target: elided <= 0.6x full; CartPole cannot reach it (``obs`` is 16 of 46 bytes).
    """

    params = [TFDATA_LAYOUTS, ["cartpole", "image"], ["full", "elided"]]
    param_names = ["layout", "spec", "mode"]
    timeout = 300

    def setup(self, layout, spec, mode):
        warm_episode_kernels(layout, spec, mode)
        stream_block(spec)

    def track_nbytes(self, layout, spec, mode):
        return filled_streams(layout, spec, SPEC_CAPACITY[spec], mode).nbytes

    track_nbytes.unit = "bytes"

    def track_bytes_per_row(self, layout, spec, mode):
        capacity = SPEC_CAPACITY[spec]
        return filled_streams(layout, spec, capacity, mode).nbytes / capacity

    track_bytes_per_row.unit = "bytes"

    def peakmem_fill(self, layout, spec, mode):
        build_and_fill_streams(layout, spec, SPEC_CAPACITY[spec], mode)

    def track_fill_rss(self, layout, spec, mode):
        proc = psutil.Process()
        gc.collect()
        before = proc.memory_info().rss
        buf = build_and_fill_streams(layout, spec, SPEC_CAPACITY[spec], mode)
        grown = proc.memory_info().rss - before
        del buf
        return grown

    track_fill_rss.unit = "bytes"


class ElisionSample:
    """``sample(256)`` from a full buffer, ``next_obs`` stored or elided.

    With elision ``next_obs`` is copied from the ``obs`` of the stream's next row (a second
    random row read per sampled row), or from the final-observation table for episode ends.
    1M CartPole rows (episodes of 200 steps) or 20,000 image rows (episodes of 1000 steps).
    """

    params = [TFDATA_LAYOUTS, ["cartpole", "image"], ["full", "elided"]]
    param_names = ["layout", "spec", "mode"]
    repeat = _MANY_SAMPLES
    timeout = 300
    batch = 256

    def setup(self, layout, spec, mode):
        warm_episode_kernels(layout, spec, mode)
        self.buf = filled_streams(layout, spec, SPEC_CAPACITY[spec], mode)
        warm_batch(self.buf, ("elision", layout, spec, mode), self.batch)

    def time_sample(self, layout, spec, mode):
        self.buf.sample(self.batch)


class Sequences:
    """``sample_sequences(32, 16)`` from 1M CartPole rows in episodes of 200 steps on average.

    ``"mask"``: a slice running past its episode's end (or the newest row) is kept and padded,
    ``batch.mask`` False there. ``"reject"``: starts are redrawn until the slice lies in one
    episode (about 7.5% of starts are refused here). ``"rows512"``: ``sample(512)``, the same
    number of rows drawn independently: the gather floor for the 512 rows of a sequence batch.
    """

    params = [TFDATA_LAYOUTS, ["mask", "reject", "rows512"]]
    param_names = ["layout", "policy"]
    repeat = _MANY_SAMPLES
    timeout = 300
    capacity = 1_000_000
    batch = 32
    length = 16

    def setup(self, layout, policy):
        warm_episode_kernels(layout, "cartpole", "full")
        buf = filled_streams(layout, "cartpole", self.capacity, "full")
        if policy == "rows512":
            self.op = partial(buf.sample, self.batch * self.length)
        else:
            self.op = partial(buf.sample_sequences, self.batch, self.length, policy=policy)
        if first_time("sequences", layout, policy):
            for _ in range(3):  # allocates this shape's output ring
                self.op()

    def time_sample(self, layout, policy):
        self.op()
