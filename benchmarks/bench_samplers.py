"""Samplers beside uniform sampling: sampling without replacement while inserting, exactly-k.

Every class takes the layout first; ``"numpy"`` is the hand-written baseline of
:mod:`benchmarks.common`: uniform is its ``sample``, and without replacement a permutation per
pass sliced batch by batch (``rng.permutation(n)``, then ``perm[p:p + B]`` and fancy indexing):
the cheapest honest form, which does not take rows written during a pass. Buffers hold 1M
CartPole rows, filled before anything is timed.

Target (issue 21): ``Sample`` without replacement at most 1.5x uniform, in the same layout;
``LimiterSample`` and ``LimiterPush``: a rate limiter that does not block adds at most 0.5 us.
``ExactlyKSample`` / ``ExactlyKPush``: exactly-k replay (``replays=4``) beside uniform; its
writes take the buffer's generic path (the generated push has no gate), so ``ExactlyKPush``
shows what the gate and that path cost a write, on free slots (``exactly_k_block``) and on a
full ring of rows awaiting replay (``exactly_k_overwrite``). No numpy baseline of exactly-k:
an honest one (a pool and counts) is this kernel written in numpy, slower per row than uniform's
fancy indexing by construction (``layout="numpy"`` raises NotImplementedError there).
"""

from __future__ import annotations

from functools import partial

import numpy as np

import tfdata

from .common import (CARTPOLE, LAYOUTS, TFDATA_LAYOUTS, NumpyBuffer, fill, fill_chunk, filled_buffer,
                     one_row, warm_kernels)

_MANY_SAMPLES = (200, 2000, 2.0)
CAPACITY = 1_000_000
SAMPLERS = ["uniform", "without_replacement"]

_CACHE: dict = {}


def buffer(layout: str, sampler: str):
    """A full 1M-row buffer of ``sampler`` (the uniform ones are the shared cached buffers)."""
    if sampler == "uniform" or layout == "numpy":
        return filled_buffer(layout, CARTPOLE, CAPACITY)
    key = (layout, sampler)
    if key not in _CACHE:
        buf = tfdata.ReplayBuffer(CARTPOLE, CAPACITY, layout=layout, seed=0, sampler=sampler)
        fill(buf, CAPACITY, fill_chunk(CARTPOLE))
        _CACHE[key] = buf
    return _CACHE[key]


class _PassSampler:
    """numpy without replacement: one permutation per pass, sliced batch by batch."""

    def __init__(self, buf: NumpyBuffer, seed: int = 0):
        self.buf, self.rng = buf, np.random.default_rng(seed)
        self.perm, self.at = self.rng.permutation(buf.size), 0

    def sample(self, batch_size: int) -> dict:
        if self.at + batch_size > len(self.perm):
            self.perm, self.at = self.rng.permutation(self.buf.size), 0
        idx = self.perm[self.at:self.at + batch_size]
        self.at += batch_size
        return {name: arr[idx] for name, arr in self.buf.arrays.items()}


class Sample:
    """Draw 256 rows from 1M CartPole rows with each sampler."""

    params = [LAYOUTS, SAMPLERS]
    param_names = ["layout", "sampler"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, sampler):
        warm_kernels()
        buf = buffer(layout, sampler)
        if layout == "numpy" and sampler == "without_replacement":
            buf = _PassSampler(buf)
        self.op = partial(buf.sample, 256)
        for _ in range(3):  # the output ring, the pool's first pass
            self.op()

    def time_sample(self, layout, sampler):
        self.op()


class Push:
    """Append one CartPole row to a full buffer of each sampler: what the sampler costs a write
    (without replacement it hears only laps of the ring, like running statistics)."""

    params = [LAYOUTS, SAMPLERS]
    param_names = ["layout", "sampler"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, sampler):
        warm_kernels()
        if layout == "numpy" and sampler != "uniform":
            raise NotImplementedError("the numpy baseline's writes do not depend on a sampler")
        self.op = partial(buffer(layout, sampler).push, one_row(CARTPOLE, seed=2))

    def time_push(self, layout, sampler):
        self.op()


# -- the rate limiter when it does not block ---------------------------------------------------------
LIMITERS = ["none", "ratio"]


def limited_buffer(layout: str, limiter: str):
    """A full 1M-row uniform buffer, with a sample-to-insert limiter that never blocks here
    (``error_buffer`` 1e12: the predicates and counts run on every call, no wait) or none."""
    if limiter == "none":
        return filled_buffer(layout, CARTPOLE, CAPACITY)
    key = (layout, "limiter")
    if key not in _CACHE:
        buf = tfdata.ReplayBuffer(CARTPOLE, CAPACITY, layout=layout, seed=0,
                                  rate_limiter=tfdata.RateLimiter(1.0, 1, 1e12))
        fill(buf, CAPACITY, fill_chunk(CARTPOLE))
        _CACHE[key] = buf
    return _CACHE[key]


#: exactly-k's deliveries per row in these benchmarks: a 1M-row pool lasts 4M deliveries
REPLAYS = 4


def exactly_k_buffer(layout: str, policy: str):
    """A full 1M-row exactly-k buffer (``replays=4``); for ``"block"`` every slot is free (each
    row delivered 4 times, then the pool is empty): a push finds its slot free."""
    key = (layout, "exactly_k", policy)
    if key not in _CACHE:
        buf = tfdata.ReplayBuffer(CARTPOLE, CAPACITY, layout=layout, seed=0, sampler="exactly_k",
                                  replays=REPLAYS, policy="overwrite" if policy in ("block", "skip") else policy)
        fill(buf, CAPACITY, fill_chunk(CARTPOLE))
        if policy == "block":  # deliver every row k times, then keep a buffer that blocks
            while buf.sampler.awaiting:
                buf.sample(min(65_536, buf.sampler.awaiting))
            state = buf.state_dict()
            buf = tfdata.ReplayBuffer(CARTPOLE, CAPACITY, layout=layout, seed=0, sampler="exactly_k",
                                      replays=REPLAYS, policy="block")
            buf.load_state_dict(state)
        elif policy == "skip":  # every other slot awaits replay, the cursor's among them
            buf = exactly_k_buffer(layout, "block")
            state = buf.state_dict()
            slots = np.arange(0, CAPACITY, 2, dtype=np.int64)
            state["exactly_k"].update(slots=slots, counts=np.full(slots.size, REPLAYS, np.int64))
            buf = tfdata.ReplayBuffer(CARTPOLE, CAPACITY, layout=layout, seed=0, sampler="exactly_k",
                                      replays=REPLAYS, policy="block")
            buf.load_state_dict(state)
        _CACHE[key] = buf
    return _CACHE[key]


class LimiterSample:
    """``sample(256)`` of 1M CartPole rows with and without a rate limiter that does not block.

    Target (issue 21): the limiter adds at most 0.5 us."""

    params = [TFDATA_LAYOUTS, LIMITERS]
    param_names = ["layout", "limiter"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, limiter):
        warm_kernels()
        self.op = partial(limited_buffer(layout, limiter).sample, 256)
        for _ in range(3):
            self.op()

    def time_sample(self, layout, limiter):
        self.op()


class LimiterPush:
    """``push`` of one CartPole row into a full 1M-row buffer with and without a rate limiter
    that does not block (the generated push with its gate, against the one without).

    Target (issue 21): the limiter adds at most 0.5 us."""

    params = [TFDATA_LAYOUTS, LIMITERS]
    param_names = ["layout", "limiter"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, limiter):
        warm_kernels()
        self.op = partial(limited_buffer(layout, limiter).push, one_row(CARTPOLE, seed=2))

    def time_push(self, layout, limiter):
        self.op()


class ExactlyKSample:
    """Draw 256 rows from 1M CartPole rows: exactly-k (each row 4 times) beside uniform."""

    params = [LAYOUTS, ["uniform", "exactly_k"]]
    param_names = ["layout", "sampler"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, sampler):
        warm_kernels()
        if sampler == "uniform":
            buf = buffer(layout, sampler)
        elif layout == "numpy":
            raise NotImplementedError("no numpy baseline of exactly-k (see the module docstring)")
        else:
            buf = exactly_k_buffer(layout, "overwrite")
            if buf.sampler.awaiting < 1024:  # a long run drained the pool: refill (not timed)
                fill(buf, CAPACITY, fill_chunk(CARTPOLE))
        self.op = partial(buf.sample, 256)
        for _ in range(3):  # the output ring
            self.op()

    def time_sample(self, layout, sampler):
        self.op()


class ExactlyKPush:
    """Append one CartPole row: uniform, exactly-k on a free slot (``"block"``, the gate lets it
    through), exactly-k skipping a row awaiting replay to the next free slot (``"skip"``: every
    other slot awaits, a ``"block"`` buffer; one kernel call per push) and exactly-k overwriting
    a row awaiting replay with no slot free (``"overwrite"``, counted)."""

    params = [LAYOUTS, ["uniform", "exactly_k_block", "exactly_k_skip", "exactly_k_overwrite"]]
    param_names = ["layout", "sampler"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, sampler):
        warm_kernels()
        if layout == "numpy" and sampler != "uniform":
            raise NotImplementedError("the numpy baseline's writes do not depend on a sampler")
        if sampler == "uniform":
            buf = buffer(layout, sampler)
        else:
            buf = exactly_k_buffer(layout, sampler.rpartition("_")[2])
        self.op = partial(buf.push, one_row(CARTPOLE, seed=2))

    def time_push(self, layout, sampler):
        self.op()
