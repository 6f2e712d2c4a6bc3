"""sampler="without_replacement" over random interleavings of push, extend (wrapping, longer than
the ring), samples of random sizes, clear and state round trips (into either layout).

Two models run beside the buffer: the pure-Python pool of ``naive.pool_sample_naive`` (the same
batches, the same RNG counter, the same passes) and the rule as sets of row serials, which
knows nothing of the algorithm (``test_without_replacement.Model``): within a pass no row is
returned twice, a pass ends only when every live row of it was drawn, a row overwritten before
it was drawn is never returned."""

from __future__ import annotations

import numpy as np
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tfdata import ReplayBuffer, Spec

from . import naive
from .conftest import ODD, assert_batches_equal, random_rows, row
from .test_without_replacement import Model

SPEC = Spec(ODD)


class WithoutReplacementMachine(RuleBasedStateMachine):
    @initialize(capacity=st.sampled_from([1, 2, 7, 33]), layout=st.sampled_from(["aos", "soa"]),
                seed=st.integers(0, 2**64 - 1))
    def setup(self, capacity, layout, seed):
        self.cap = capacity
        self.buf = ReplayBuffer(SPEC, capacity, layout=layout, seed=seed,
                                sampler="without_replacement")
        self.ring = naive.RingModel(capacity)
        self.rule = Model(capacity)
        self.serial = [None] * capacity  # the rule's id of the row in each slot
        self.next_serial = 0
        self.pending = 0  # rows written since the pool last heard of the writes
        self.pool, self.m, self.passes = [0] * capacity, 0, 0
        self.key, self.counter = naive.key_of(seed), 0
        self.rng = np.random.default_rng(seed % 2**32)

    def _wrote(self, k):
        ids = list(range(self.next_serial, self.next_serial + k))
        for j, i in enumerate(ids):  # later rows of a write longer than the ring win
            self.serial[(self.ring.cursor - k + j) % self.cap] = i
        self.rule.write(ids)
        self.next_serial += k
        self.pending += k

    def _sync(self, batch):
        """What the sampler does at a sample of ``batch`` rows (0: a state dict)."""
        count = min(self.pending, self.cap)
        start = (self.ring.cursor - self.pending) % self.cap
        self.pool, self.m, self.passes, idx, self.counter = naive.pool_sample_naive(
            self.pool, self.m, self.passes, start, count, self.ring.size, self.key, self.counter,
            batch)
        self.pending = 0
        return idx

    @rule()
    def push(self):
        r = row(random_rows(SPEC, 1, self.rng), 0)
        self.buf.push(r)
        self.ring.push(r)
        self._wrote(1)

    @rule(k=st.sampled_from([0, 1, 2, 5, 7, 33, 34, 80]))
    def extend(self, k):
        data = random_rows(SPEC, k, self.rng)  # 7, 33: to a ring's end; 34, 80: past it
        self.buf.extend(data)
        self.ring.extend(data)
        self._wrote(k)

    @precondition(lambda self: self.ring.size > 0)
    @rule(data=st.data())
    def sample(self, data):
        bs = data.draw(st.integers(1, self.ring.size))
        batch = self.buf.sample(bs, copy=data.draw(st.booleans()))
        idx = self._sync(bs)
        np.testing.assert_array_equal(batch.indices, idx)
        assert_batches_equal(batch, self.ring.rows(idx))
        self.rule.check_batch([self.serial[s] for s in idx])
        assert self.buf.sampler.passes == self.passes == self.rule.passes

    @rule()
    def clear(self):
        self.buf.clear()
        self.ring.clear()
        self.rule = Model(self.cap)
        self.serial = [None] * self.cap
        self.pending, self.m, self.passes = 0, 0, 0

    @rule(layout=st.sampled_from(["aos", "soa"]))
    def round_trip(self, layout):
        state = self.buf.state_dict()
        if self.ring.size:  # the state adds the rows written since the last sample
            self._sync(0)
        self.pending = 0
        self.buf = ReplayBuffer(SPEC, self.cap, layout=layout, sampler="without_replacement")
        self.buf.load_state_dict(state)

    @invariant()
    def same_pool(self):
        if hasattr(self, "buf"):
            assert len(self.buf) == self.ring.size
            assert self.buf.sampler.counter == self.counter
            if self.pending == 0 and self.ring.size:
                assert self.buf.sampler.undrawn == self.m


WithoutReplacementMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40,
                                                       deadline=None)
TestWithoutReplacementMachine = WithoutReplacementMachine.TestCase
